//! The shared vocabulary for "what is wrong, and where": [`FieldPath`] and [`Violation`].
//!
//! Paths render like the Kubernetes API server's own field errors
//! (`spec.podFailurePolicy.rules[0].onExitCodes.values`), so a message from gpu-guard can be
//! compared line for line with what `kubectl create --dry-run=server` prints.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// A path into an object, rendered the way the API server renders field errors.
///
/// A path is built for every field a check visits and read only when something is wrong, so a
/// step is cheap: paths share their parent (a chain of reference-counted steps) and a field
/// name given as a `&'static str` is not copied.
#[derive(Clone, Default)]
pub struct FieldPath {
    last: Option<Arc<Step>>,
}

struct Step {
    parent: Option<Arc<Step>>,
    segment: Segment,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    Field(Cow<'static, str>),
    Index(usize),
    Key(String),
}

impl FieldPath {
    /// The root path (renders as an empty string).
    pub fn root() -> Self {
        Self::default()
    }

    /// A path made of dotted field names: `FieldPath::new(["spec", "template"])`.
    pub fn new<'a>(fields: impl IntoIterator<Item = &'a str>) -> Self {
        fields
            .into_iter()
            .fold(Self::root(), |path, field| path.child(field.to_owned()))
    }

    /// This path with one more field name.
    #[must_use]
    pub fn child(&self, field: impl Into<Cow<'static, str>>) -> Self {
        self.with(Segment::Field(field.into()))
    }

    /// This path with a list index: `rules[3]`.
    #[must_use]
    pub fn index(&self, index: usize) -> Self {
        self.with(Segment::Index(index))
    }

    /// This path with a map key: `limits[nvidia.com/gpu]`.
    #[must_use]
    pub fn key(&self, key: &str) -> Self {
        self.with(Segment::Key(key.to_owned()))
    }

    fn with(&self, segment: Segment) -> Self {
        Self {
            last: Some(Arc::new(Step {
                parent: self.last.clone(),
                segment,
            })),
        }
    }

    /// The segments from the root.
    fn segments(&self) -> Vec<&Segment> {
        let mut segments = Vec::new();
        let mut step = self.last.as_deref();
        while let Some(current) = step {
            segments.push(&current.segment);
            step = current.parent.as_deref();
        }
        segments.reverse();
        segments
    }

    /// The path as a sequence of keys into a YAML/JSON document: field names and map keys as
    /// strings, indices as numbers. Used to find the line of a field in a source file.
    pub fn document_keys(&self) -> Vec<DocumentKey<'_>> {
        self.segments()
            .into_iter()
            .map(|segment| match segment {
                Segment::Field(name) => DocumentKey::Name(name),
                Segment::Key(name) => DocumentKey::Name(name),
                Segment::Index(index) => DocumentKey::Index(*index),
            })
            .collect()
    }
}

impl PartialEq for FieldPath {
    fn eq(&self, other: &Self) -> bool {
        self.segments() == other.segments()
    }
}

impl Eq for FieldPath {}

impl std::hash::Hash for FieldPath {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.segments().hash(state);
    }
}

impl fmt::Debug for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FieldPath({self:?})", self = self.to_string())
    }
}

/// One step of [`FieldPath::document_keys`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocumentKey<'a> {
    Name(&'a str),
    Index(usize),
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (position, segment) in self.segments().into_iter().enumerate() {
            match segment {
                Segment::Field(name) if position == 0 => f.write_str(name)?,
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Key(key) => write!(f, "[{key}]")?,
            }
        }
        Ok(())
    }
}

/// The kinds of field error the API server reports (`field.ErrorType` in apimachinery).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// `Invalid value: <value>: <detail>`; the value is omitted when the server omits it.
    Invalid { value: Option<String> },
    /// `Required value: <detail>`.
    Required,
    /// `Duplicate value: <value>`.
    Duplicate { value: String },
    /// `Too many: <count>: must have at most <max> items`.
    TooMany { count: usize, max: usize },
    /// `Unsupported value: <value>: supported values: <list>`.
    NotSupported {
        value: String,
        supported: Vec<String>,
    },
}

/// One thing wrong with an object, at one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub path: FieldPath,
    pub kind: ViolationKind,
    /// Why the value is wrong; for `Invalid` and `Required`, also how to fix it.
    pub detail: String,
}

impl Violation {
    pub fn invalid(path: FieldPath, value: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            path,
            kind: ViolationKind::Invalid {
                value: Some(value.into()),
            },
            detail: detail.into(),
        }
    }

    /// An `Invalid` error that does not print the value (Go's `field.OmitValueType`).
    pub fn invalid_without_value(path: FieldPath, detail: impl Into<String>) -> Self {
        Self {
            path,
            kind: ViolationKind::Invalid { value: None },
            detail: detail.into(),
        }
    }

    pub fn required(path: FieldPath, detail: impl Into<String>) -> Self {
        Self {
            path,
            kind: ViolationKind::Required,
            detail: detail.into(),
        }
    }

    pub fn duplicate(path: FieldPath, value: impl Into<String>) -> Self {
        Self {
            path,
            kind: ViolationKind::Duplicate {
                value: value.into(),
            },
            detail: String::new(),
        }
    }

    pub fn too_many(path: FieldPath, count: usize, max: usize) -> Self {
        Self {
            path,
            kind: ViolationKind::TooMany { count, max },
            detail: String::new(),
        }
    }

    pub fn not_supported(path: FieldPath, value: &str, supported: &[&str]) -> Self {
        Self {
            path,
            kind: ViolationKind::NotSupported {
                value: quote(value),
                supported: supported.iter().map(|s| quote(s)).collect(),
            },
            detail: String::new(),
        }
    }
}

/// Quotes a string the way Go's `%q` does for the plain ASCII values found in field errors.
pub fn quote(value: &str) -> String {
    format!("{value:?}")
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.path)?;
        match &self.kind {
            ViolationKind::Invalid { value: Some(value) } => {
                write!(f, "Invalid value: {value}: {}", self.detail)
            }
            ViolationKind::Invalid { value: None } => write!(f, "Invalid value: {}", self.detail),
            ViolationKind::Required => write!(f, "Required value: {}", self.detail),
            ViolationKind::Duplicate { value } => write!(f, "Duplicate value: {value}"),
            ViolationKind::TooMany { count, max } => {
                write!(f, "Too many: {count}: must have at most {max} items")
            }
            ViolationKind::NotSupported { value, supported } => write!(
                f,
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_like_the_api_server() {
        let path = FieldPath::new(["spec", "podFailurePolicy", "rules"])
            .index(0)
            .child("onExitCodes")
            .child("values");
        assert_eq!(
            path.to_string(),
            "spec.podFailurePolicy.rules[0].onExitCodes.values"
        );
        let keyed = FieldPath::new(["resources", "limits"]).key("nvidia.com/gpu");
        assert_eq!(keyed.to_string(), "resources.limits[nvidia.com/gpu]");
        assert_eq!(FieldPath::root().to_string(), "");
    }

    #[test]
    fn violations_render_like_the_api_server() {
        let path = FieldPath::new(["spec", "podReplacementPolicy"]);
        let unsupported = Violation::not_supported(path, "TerminatingOrFailed", &["Failed"]);
        assert_eq!(
            unsupported.to_string(),
            r#"spec.podReplacementPolicy: Unsupported value: "TerminatingOrFailed": supported values: "Failed""#
        );
        let too_many = Violation::too_many(FieldPath::new(["spec", "rules"]), 21, 20);
        assert_eq!(
            too_many.to_string(),
            "spec.rules: Too many: 21: must have at most 20 items"
        );
    }
}
