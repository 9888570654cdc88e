//! Splitting an input into documents before anything is parsed, so that documents are
//! independent: a syntax error in one never costs the documents after it, and no document is
//! held longer than it takes to process it.
//!
//! YAML is split at document markers, as kubectl splits it (`k8s.io/apimachinery`
//! `pkg/util/yaml/decoder.go`, `YAMLReader.Read`, v0.36): a line that starts with `---` followed
//! by nothing, a space, a tab or a comment begins a new document (YAML forbids such a line
//! inside any node, so the split is exact). Unlike kubectl, a separator line that carries
//! content (`--- {a: 1}`, `--- |`) is kept as the first line of its document, as YAML allows.
//!
//! A JSON stream (an input whose first non-blank character is `{`) is split at the end of each
//! top-level value, by a scanner that follows strings and brackets; that scanner also measures
//! the nesting depth, so a document too deep for the reader is refused before it is parsed.
//!
//! Memory is bounded by `max_document_bytes`: a longer document is not kept, only measured,
//! and reported as too large.

use std::io::{self, BufRead};

/// One document's text, split off its input and not yet parsed.
#[derive(Debug, Default)]
pub struct RawDocument {
    /// The 1-based line of the input its text starts at.
    pub line: usize,
    /// Its text; empty when it was too large to keep.
    pub text: Vec<u8>,
    /// Its size in bytes when it exceeds the limit (its text is then not kept).
    pub too_large: Option<usize>,
    /// For a JSON document: its nesting depth.
    pub depth: usize,
    /// How to parse it.
    pub syntax: Syntax,
}

impl RawDocument {
    fn start(line: usize, syntax: Syntax) -> Self {
        Self {
            line,
            syntax,
            ..Self::default()
        }
    }

    /// Appends `bytes` unless that makes the document larger than `limit`.
    fn push(&mut self, bytes: &[u8], limit: usize) {
        match &mut self.too_large {
            Some(size) => *size += bytes.len(),
            None if self.text.len() + bytes.len() > limit => {
                self.too_large = Some(self.text.len() + bytes.len());
                self.text = Vec::new();
            }
            None => self.text.extend_from_slice(bytes),
        }
    }

    fn is_empty(&self) -> bool {
        self.text.is_empty() && self.too_large.is_none()
    }
}

/// Which syntax a document is in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Syntax {
    #[default]
    Yaml,
    Json,
}

/// Splits a reader into [`RawDocument`]s.
pub struct Splitter<R> {
    reader: R,
    limit: usize,
    syntax: Option<Syntax>,
    /// The next line's number.
    line: usize,
    /// A YAML separator line read at the end of the previous document: it starts the next.
    carried: Option<(usize, Vec<u8>)>,
    at_start: bool,
    done: bool,
}

impl<R: BufRead> Splitter<R> {
    pub fn new(reader: R, max_document_bytes: usize) -> Self {
        Self {
            reader,
            limit: max_document_bytes,
            syntax: None,
            line: 1,
            carried: None,
            at_start: true,
            done: false,
        }
    }

    /// The next document, or `None` at the end of the input.
    pub fn next_document(&mut self) -> io::Result<Option<RawDocument>> {
        if self.done {
            return Ok(None);
        }
        if self.at_start {
            self.at_start = false;
            self.skip_bom()?;
        }
        let syntax = match self.syntax {
            Some(syntax) => syntax,
            // A separator line carried over begins a YAML document.
            None if self.carried.is_some() => Syntax::Yaml,
            None => self.sniff()?,
        };
        self.syntax = Some(syntax);
        let document = match syntax {
            Syntax::Yaml => self.next_yaml()?,
            Syntax::Json => self.next_json()?,
        };
        if document.is_none() {
            self.done = true;
        }
        Ok(document)
    }

    fn skip_bom(&mut self) -> io::Result<()> {
        let buffer = self.reader.fill_buf()?;
        if buffer.starts_with(b"\xEF\xBB\xBF") {
            self.reader.consume(3);
        }
        Ok(())
    }

    /// JSON when the first non-blank byte is `{`, else YAML. Blank lines before the first
    /// document are consumed (their lines counted), the blanks that start its first line are
    /// not: they are part of the YAML (`\tkind: Job` is a tab in the indentation, refused as
    /// kubectl refuses it, and `  a: 1` then `  b: 2` is a mapping indented by two).
    fn sniff(&mut self) -> io::Result<Syntax> {
        loop {
            let buffer = self.reader.fill_buf()?;
            if buffer.is_empty() {
                return Ok(Syntax::Yaml);
            }
            let blanks = buffer
                .iter()
                .position(|byte| !matches!(byte, b' ' | b'\t' | b'\r'))
                .unwrap_or(buffer.len());
            match buffer.get(blanks) {
                Some(b'\n') => {
                    self.line += 1;
                    self.reader.consume(blanks + 1);
                }
                Some(b'{') => return Ok(Syntax::Json),
                Some(_) => return Ok(Syntax::Yaml),
                // Blanks up to the end of the buffer (a line of more blanks than it holds):
                // consumed, they cannot be more than indentation.
                None => self.reader.consume(blanks),
            }
        }
    }

    /// Reads one line (with its newline) into `line`, keeping at most `keep` bytes of it (the
    /// rest is consumed and counted); returns the line's full length, 0 at the end.
    fn read_line(&mut self, line: &mut Vec<u8>, keep: usize) -> io::Result<usize> {
        let mut length = 0;
        loop {
            let buffer = fill(&mut self.reader)?;
            if buffer.is_empty() {
                return Ok(length);
            }
            let (taken, ended) = match memchr::memchr(b'\n', buffer) {
                Some(at) => (at + 1, true),
                None => (buffer.len(), false),
            };
            let room = keep.saturating_sub(line.len()).min(taken);
            line.extend_from_slice(&buffer[..room]);
            self.reader.consume(taken);
            length += taken;
            if ended {
                return Ok(length);
            }
        }
    }

    fn next_yaml(&mut self) -> io::Result<Option<RawDocument>> {
        let mut document = match self.carried.take() {
            Some((line, separator)) => {
                let mut document = RawDocument::start(line, Syntax::Yaml);
                document.push(&separator, self.limit);
                document
            }
            None => RawDocument::start(self.line, Syntax::Yaml),
        };
        let mut line = Vec::new();
        loop {
            line.clear();
            // Keep the whole line while the document fits; past the limit only its start,
            // to recognise a separator.
            let keep = if document.too_large.is_some() {
                8
            } else {
                (self.limit - document.text.len() + 1).max(8)
            };
            let length = self.read_line(&mut line, keep)?;
            if length == 0 {
                return Ok((!document.is_empty()).then_some(document));
            }
            let number = self.line;
            self.line += 1;
            if is_separator(&line) && !document.is_empty() {
                self.carried = Some((number, line));
                return Ok(Some(document));
            }
            if length > line.len() {
                // Only part of the line was kept: the document is too large.
                document.push(&line, 0);
                if let Some(size) = &mut document.too_large {
                    *size += length - line.len();
                }
            } else {
                document.push(&line, self.limit);
            }
        }
    }

    fn next_json(&mut self) -> io::Result<Option<RawDocument>> {
        let mut scanner = JsonScanner::default();
        let mut document: Option<RawDocument> = None;
        loop {
            let buffer = fill(&mut self.reader)?;
            if buffer.is_empty() {
                return Ok(document.map(|mut document| {
                    document.depth = scanner.max_depth;
                    if scanner.dashes == 3 && scanner.line_start {
                        // The input ends in a separator line: not part of the document.
                        document
                            .text
                            .truncate(document.text.len().saturating_sub(3));
                    }
                    document
                }));
            }
            let mut at = 0;
            if document.is_none() {
                // Blank space between documents.
                while at < buffer.len() && buffer[at].is_ascii_whitespace() {
                    if buffer[at] == b'\n' {
                        self.line += 1;
                    }
                    at += 1;
                }
                if at == buffer.len() {
                    self.reader.consume(at);
                    continue;
                }
                if buffer[at..].starts_with(b"---") {
                    // A separator between JSON documents: what follows is sniffed afresh.
                    self.reader.consume(at);
                    self.separator_line()?;
                    return self.next_document();
                }
                document = Some(RawDocument::start(self.line, Syntax::Json));
                scanner.line_start = at == 0 || buffer[at - 1] == b'\n';
            }
            let start = at;
            let (end, outcome) = scanner.scan(&buffer[start..]);
            let taken = &buffer[start..start + end];
            self.line += memchr::memchr_iter(b'\n', taken).count();
            let current = document.as_mut().expect("started above");
            current.push(taken, self.limit);
            self.reader.consume(start + end);
            match outcome {
                Scanned::More => {}
                Scanned::Complete => {
                    let mut document = document.take().expect("started above");
                    document.depth = scanner.max_depth;
                    return Ok(Some(document));
                }
                Scanned::Separator => {
                    // A `---` line cannot be in JSON (strings hold no line breaks): the
                    // document ends unfinished before it, and what follows is sniffed afresh.
                    let mut document = document.take().expect("started above");
                    document.depth = scanner.max_depth;
                    if document.too_large.is_none() {
                        document
                            .text
                            .truncate(document.text.len().saturating_sub(3));
                    }
                    self.separator_line()?;
                    return Ok(Some(document));
                }
            }
        }
    }

    /// After `---` was consumed or is next: the rest of the separator line is carried to
    /// the next document, which is YAML from there on.
    fn separator_line(&mut self) -> io::Result<()> {
        let mut line = b"---".to_vec();
        let buffer = self.reader.fill_buf()?;
        if buffer.starts_with(b"---") {
            self.reader.consume(3);
        }
        self.read_line(&mut line, 4096)?;
        self.carried = Some((self.line, line));
        self.line += 1;
        self.syntax = None;
        Ok(())
    }
}

/// The reader's buffered bytes, refilled when empty (empty at the end); an interrupted read
/// is retried.
fn fill<R: BufRead>(reader: &mut R) -> io::Result<&[u8]> {
    loop {
        match reader.fill_buf() {
            Ok(_) => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    reader.fill_buf()
}

/// `---` at the start of a line, followed by its end, a space, a tab or nothing.
fn is_separator(line: &[u8]) -> bool {
    line.starts_with(b"---") && matches!(line.get(3), None | Some(b' ' | b'\t' | b'\r' | b'\n'))
}

/// What [`JsonScanner::scan`] found at the end of the bytes it took.
#[derive(Debug, PartialEq, Eq)]
enum Scanned {
    /// The value goes on.
    More,
    /// The value ended.
    Complete,
    /// A `---` separator line began (its dashes are the last three bytes taken).
    Separator,
}

/// Follows one top-level JSON value through strings and brackets, and watches for `---`
/// separator lines.
#[derive(Default)]
struct JsonScanner {
    depth: usize,
    max_depth: usize,
    in_string: bool,
    escaped: bool,
    /// A top-level value that is not an object or array: ends at the next blank or bracket.
    scalar: bool,
    started: bool,
    /// At the start of a line, and how many dashes it starts with.
    line_start: bool,
    dashes: u8,
}

impl JsonScanner {
    /// Scans `bytes`; returns how many belong to the value and what ended the scan.
    fn scan(&mut self, bytes: &[u8]) -> (usize, Scanned) {
        for (at, &byte) in bytes.iter().enumerate() {
            if self.line_start {
                if byte == b'-' && self.dashes < 3 {
                    self.dashes += 1;
                } else if self.dashes == 3 && matches!(byte, b' ' | b'\t' | b'\r' | b'\n') {
                    return (at, Scanned::Separator);
                } else {
                    self.line_start = false;
                    self.dashes = 0;
                }
            }
            if byte == b'\n' {
                self.line_start = true;
                self.dashes = 0;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return (at + 1, Scanned::Complete);
                    }
                }
                continue;
            }
            if self.scalar {
                if byte.is_ascii_whitespace() || matches!(byte, b'{' | b'[' | b'"') {
                    return (at, Scanned::Complete);
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    self.depth += 1;
                    self.max_depth = self.max_depth.max(self.depth);
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return (at + 1, Scanned::Complete);
                    }
                }
                _ if !self.started && !byte.is_ascii_whitespace() => self.scalar = true,
                _ => {}
            }
            self.started = true;
        }
        (bytes.len(), Scanned::More)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &[u8], limit: usize) -> Vec<(usize, String, Option<usize>)> {
        let mut splitter = Splitter::new(text, limit);
        let mut documents = Vec::new();
        while let Some(document) = splitter.next_document().unwrap() {
            documents.push((
                document.line,
                String::from_utf8(document.text).unwrap(),
                document.too_large,
            ));
        }
        documents
    }

    #[test]
    fn yaml_is_split_at_separator_lines_with_line_numbers() {
        let documents = split(
            b"a: 1\n---\nb: 2\n--- # c\n---\n--- {c: 3}\nd: |\n  ---x\n",
            1 << 20,
        );
        assert_eq!(
            documents,
            vec![
                (1, "a: 1\n".to_owned(), None),
                (2, "---\nb: 2\n".to_owned(), None),
                (4, "--- # c\n".to_owned(), None),
                (5, "---\n".to_owned(), None),
                (6, "--- {c: 3}\nd: |\n  ---x\n".to_owned(), None),
            ]
        );
    }

    #[test]
    fn a_line_that_only_starts_with_dashes_is_not_a_separator() {
        let documents = split(b"a: 1\n----\n---b\n--- \n", 1 << 20);
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[0].1, "a: 1\n----\n---b\n");
    }

    #[test]
    fn a_document_over_the_limit_is_measured_not_kept_and_the_next_is_whole() {
        let mut text = b"a: 1\n---\nbig: ".to_vec();
        text.extend(std::iter::repeat_n(b'x', 5000));
        text.extend(b"\nmore: 1\n---\nc: 3\n");
        let documents = split(&text, 100);
        assert_eq!(documents[0], (1, "a: 1\n".to_owned(), None));
        assert_eq!(documents[1].1, "");
        assert_eq!(documents[1].2, Some(4 + 5 + 5000 + 1 + 8));
        assert_eq!(documents[2], (5, "---\nc: 3\n".to_owned(), None));
    }

    #[test]
    fn json_streams_are_split_per_value_through_strings_and_brackets() {
        let text = b"\n{\"a\": \"}{\\\"\"}\n\n{\"b\": [[1]]} {\"c\": {}}";
        let mut splitter = Splitter::new(&text[..], 1 << 20);
        let mut seen = Vec::new();
        while let Some(document) = splitter.next_document().unwrap() {
            assert_eq!(document.syntax, Syntax::Json);
            seen.push((
                document.line,
                String::from_utf8(document.text).unwrap(),
                document.depth,
            ));
        }
        assert_eq!(
            seen,
            vec![
                (2, "{\"a\": \"}{\\\"\"}".to_owned(), 1),
                (4, "{\"b\": [[1]]}".to_owned(), 3),
                (4, "{\"c\": {}}".to_owned(), 2),
            ]
        );
    }

    #[test]
    fn a_separator_line_ends_an_unfinished_json_document_and_yaml_may_follow() {
        let text = b"{\"a\": [1,\n---\nb: 2\n--- {c: 3}\n";
        let mut splitter = Splitter::new(&text[..], 1 << 20);
        let mut seen = Vec::new();
        while let Some(document) = splitter.next_document().unwrap() {
            seen.push((
                document.line,
                String::from_utf8(document.text).unwrap(),
                document.syntax,
            ));
        }
        assert_eq!(
            seen,
            vec![
                (1, "{\"a\": [1,\n".to_owned(), Syntax::Json),
                (2, "---\nb: 2\n".to_owned(), Syntax::Yaml),
                (4, "--- {c: 3}\n".to_owned(), Syntax::Yaml),
            ]
        );
    }

    #[test]
    fn a_byte_order_mark_is_dropped() {
        let documents = split(b"\xEF\xBB\xBFa: 1\n", 1 << 20);
        assert_eq!(documents, vec![(1, "a: 1\n".to_owned(), None)]);
    }
}
