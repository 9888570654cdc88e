//! The manifest inputs of `mutate` and `check`: files, directories and stdin, read document by
//! document within [`Limits`], in two passes: a first that only gathers the cluster facts the
//! inputs ship (PriorityClasses, Nodes, DRA objects: a Job may come before the template it
//! claims from), and a second that processes and writes each document as it is read. Stdin is
//! copied to an unnamed temporary file so that it can be read twice with bounded memory.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::PathBuf;

use clap::Args;

use gpu_guard_manifest::{self as manifest, Documents, InputError, Limits};

/// The inputs flags shared by `mutate` and `check`.
#[derive(Debug, Args)]
pub struct InputArgs {
    /// A file, a directory, or - for stdin. Repeat for several.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<PathBuf>,
    /// The largest document read, in bytes, or with a suffix Ki, Mi or Gi (e.g. 64Mi). A
    /// larger document is reported as unreadable, not read.
    #[arg(long, value_name = "SIZE", default_value = "16Mi", value_parser = parse_size)]
    pub max_document_bytes: usize,
}

impl InputArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            max_document_bytes: self.max_document_bytes,
            ..Limits::default()
        }
    }
}

/// Why a `--max-document-bytes` value is refused (clap prints it after the flag and value).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum SizeError {
    #[error("{0:?}: expected bytes, or a number with Ki, Mi or Gi")]
    Unit(String),
    #[error("{0:?}: expected a positive size, e.g. 16Mi")]
    NotPositive(String),
}

/// `1048576`, `1024Ki`, `1Mi`, `1Gi`: a size in bytes, as Kubernetes writes binary quantities.
fn parse_size(text: &str) -> Result<usize, SizeError> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return Err(SizeError::Unit(text.to_owned())),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|number| number.checked_mul(1 << shift))
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| SizeError::NotPositive(text.to_owned()))
}

/// One input file (or stdin, spooled).
enum Source {
    File(PathBuf),
    Stdin(File),
}

/// The files the `-f` flags name, directories expanded, ready to be read (twice).
pub struct Inputs {
    sources: Vec<(String, Source)>,
    limits: Limits,
}

impl Inputs {
    /// Expands the inputs; an input that does not exist or cannot be listed, or stdin that
    /// cannot be copied, is an error (reported, the others still read).
    pub fn open(args: &InputArgs) -> (Self, Vec<InputError>) {
        let mut sources = Vec::new();
        let mut errors = Vec::new();
        for input in &args.files {
            let name = input.display().to_string();
            if name == "-" {
                match spool_stdin() {
                    Ok(file) => sources.push((name, Source::Stdin(file))),
                    Err(error) => errors.push(InputError::Read {
                        source_name: name,
                        error,
                    }),
                }
                continue;
            }
            match manifest::expand(input) {
                Ok(files) => sources.extend(
                    files
                        .into_iter()
                        .map(|file| (file.display().to_string(), Source::File(file))),
                ),
                Err(error) => errors.push(InputError::Read {
                    source_name: name,
                    error,
                }),
            }
        }
        (
            Self {
                sources,
                limits: args.limits(),
            },
            errors,
        )
    }

    /// Each input's documents, from its start, in order (a file that cannot be opened is an
    /// error in its place).
    pub fn each(&self) -> impl Iterator<Item = Result<Documents, InputError>> + '_ {
        self.sources.iter().map(|(name, source)| match source {
            Source::File(path) => Documents::open_as(path, name.clone(), self.limits),
            Source::Stdin(file) => file
                .try_clone()
                .and_then(|mut file| {
                    file.seek(SeekFrom::Start(0))?;
                    Ok(file)
                })
                .map(|file| {
                    Documents::new(
                        name.clone(),
                        Box::new(io::BufReader::with_capacity(1 << 16, file)),
                        self.limits,
                    )
                })
                .map_err(|error| InputError::Read {
                    source_name: name.clone(),
                    error,
                }),
        })
    }

    /// The first pass: every readable document whose text names one of `kinds` (a cheap test
    /// on the raw text before parsing, so the pass costs little more than reading), each
    /// object of it (`List` items flattened) given to `learn`. Errors are left to the second
    /// pass, which reports them in place.
    pub fn prescan(&self, kinds: &[&str], learn: &mut dyn FnMut(&manifest::Object<'_>)) {
        for documents in self.each().flatten() {
            for document in documents.only_naming(kinds).flatten() {
                for object in manifest::objects(std::slice::from_ref(&document)) {
                    learn(&object);
                }
            }
        }
    }
}

/// Copies stdin to an unnamed temporary file (removed when closed).
fn spool_stdin() -> io::Result<File> {
    let mut file = tempfile::tempfile()?;
    io::copy(&mut io::stdin().lock(), &mut file)?;
    file.flush()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64Ki"), Ok(64 << 10));
        assert_eq!(parse_size("16Mi"), Ok(16 << 20));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        for bad in ["", "0", "16M", "1.5Mi", "-1", "Mi"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
