//! A decoding problem as parts ([`Problem`]), and those parts in the words of the person who
//! wrote the input: `expected a whole number, found the string "abc"` where serde would say
//! `invalid type: string "abc", expected i64`.

use std::fmt;

use serde::de::{self, Expected, Unexpected};

/// What went wrong decoding one value, as serde's `de::Error` constructors were given it.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// A value of the wrong type, or out of its type's range.
    Mismatch {
        found: Found,
        expected: String,
    },
    /// A list of the wrong length.
    Length {
        length: usize,
        expected: String,
    },
    UnknownVariant {
        variant: String,
        expected: &'static [&'static str],
    },
    UnknownField {
        field: String,
        expected: &'static [&'static str],
    },
    MissingField(&'static str),
    DuplicateField(&'static str),
    /// A message of the type itself (`found apiVersion "v1"`).
    Other(String),
}

/// The value that was found instead.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// An integer, in decimal.
    Integer(String),
    Float(f64),
    Bool(bool),
    Char(char),
    Str(String),
    Bytes,
    Null,
    Seq,
    Map,
    /// An `Option` or a newtype: there was a value, of the wrong kind.
    Value,
    /// An enum variant (a YAML tag).
    Tagged,
    /// What a type's own code said it found.
    Other(String),
}

impl From<Unexpected<'_>> for Found {
    fn from(unexpected: Unexpected<'_>) -> Self {
        match unexpected {
            Unexpected::Bool(v) => Self::Bool(v),
            Unexpected::Unsigned(v) => Self::Integer(v.to_string()),
            Unexpected::Signed(v) => Self::Integer(v.to_string()),
            Unexpected::Float(v) => Self::Float(v),
            Unexpected::Char(v) => Self::Char(v),
            Unexpected::Str(v) => Self::Str(v.to_owned()),
            Unexpected::Bytes(_) => Self::Bytes,
            Unexpected::Unit => Self::Null,
            Unexpected::Option | Unexpected::NewtypeStruct => Self::Value,
            Unexpected::Seq => Self::Seq,
            Unexpected::Map => Self::Map,
            Unexpected::Enum
            | Unexpected::UnitVariant
            | Unexpected::NewtypeVariant
            | Unexpected::TupleVariant
            | Unexpected::StructVariant => Self::Tagged,
            Unexpected::Other(what) => Self::Other(what.to_owned()),
        }
    }
}

impl Problem {
    /// The same problem about an integer serde could only call "an integer" (beyond 64 bits).
    #[must_use]
    pub(super) fn found_integer(self, value: i128) -> Self {
        match self {
            Self::Mismatch {
                found: Found::Other(_),
                expected,
            } => Self::Mismatch {
                found: Found::Integer(value.to_string()),
                expected,
            },
            other => other,
        }
    }
}

impl de::Error for Problem {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Self::Other(message.to_string())
    }
    fn invalid_type(unexpected: Unexpected<'_>, expected: &dyn Expected) -> Self {
        Self::Mismatch {
            found: unexpected.into(),
            expected: expected.to_string(),
        }
    }
    fn invalid_value(unexpected: Unexpected<'_>, expected: &dyn Expected) -> Self {
        Self::invalid_type(unexpected, expected)
    }
    fn invalid_length(length: usize, expected: &dyn Expected) -> Self {
        Self::Length {
            length,
            expected: expected.to_string(),
        }
    }
    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Self::UnknownVariant {
            variant: variant.to_owned(),
            expected,
        }
    }
    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Self::UnknownField {
            field: field.to_owned(),
            expected,
        }
    }
    fn missing_field(field: &'static str) -> Self {
        Self::MissingField(field)
    }
    fn duplicate_field(field: &'static str) -> Self {
        Self::DuplicateField(field)
    }
}

impl std::error::Error for Problem {}

/// The problem in words.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mismatch { found, expected } => {
                let integer = matches!(found, Found::Integer(_));
                write!(
                    f,
                    "expected {}, found {found}",
                    expected_in_words(expected, integer)
                )
            }
            // A derived struct also decodes from a list of its fields' values, and says so.
            Self::Length { expected, .. } if is_struct(expected) => {
                f.write_str("expected a map, found a list")
            }
            Self::Length { length, expected } => {
                write!(f, "invalid length {length}, expected {expected}")
            }
            Self::UnknownVariant { variant, expected } => {
                write!(
                    f,
                    "unknown value `{variant}`, {}",
                    one_of(expected, "variants")
                )
            }
            Self::UnknownField { field, expected } => {
                write!(f, "unknown field `{field}`, {}", one_of(expected, "fields"))
            }
            Self::MissingField(field) => write!(f, "missing field `{field}`"),
            Self::DuplicateField(field) => write!(f, "duplicate field `{field}`"),
            Self::Other(message) => f.write_str(message),
        }
    }
}

/// `expected `a``, `expected `a` or `b``, `expected one of `a`, `b`, `c``.
fn one_of(names: &[&str], what: &str) -> String {
    match names {
        [] => format!("there are no {what}"),
        [one] => format!("expected `{one}`"),
        [one, two] => format!("expected `{one}` or `{two}`"),
        _ => {
            let listed: Vec<String> = names.iter().map(|name| format!("`{name}`")).collect();
            format!("expected one of {}", listed.join(", "))
        }
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Integer(digits) => f.write_str(digits),
            Self::Float(value) if value.is_finite() && value.fract() == 0.0 => {
                write!(f, "{value:.1}")
            }
            Self::Float(value) => write!(f, "{value}"),
            Self::Bool(value) => write!(f, "{value}"),
            Self::Char(character) => write!(f, "the character {character:?}"),
            Self::Str(text) => write!(f, "the string {text:?}"),
            Self::Bytes => f.write_str("bytes"),
            Self::Null => f.write_str("null"),
            Self::Seq => f.write_str("a list"),
            Self::Map => f.write_str("a map"),
            Self::Value => f.write_str("a value"),
            Self::Tagged => f.write_str("a tagged value"),
            Self::Other(what) => f.write_str(what),
        }
    }
}

/// A derived struct's description of itself (`struct Guard`, `tuple struct Pair`).
fn is_struct(expected: &str) -> bool {
    expected.starts_with("struct ") || expected.starts_with("tuple struct ")
}

/// What a type expected, in words. `expected` is how the type's visitor describes itself (a
/// term: `i32`, `a sequence`, `struct Guard`, `ObjectMeta`), `out_of_range`: an integer was
/// found, so the range of an integer type is what matters.
fn expected_in_words(expected: &str, out_of_range: bool) -> String {
    let range = |min: i128, max: u128| {
        if out_of_range {
            format!("a whole number from {min} to {max}")
        } else {
            "a whole number".to_owned()
        }
    };
    match expected {
        "i8" => range(i8::MIN.into(), 127),
        "i16" => range(i16::MIN.into(), 32_767),
        "i32" => range(i32::MIN.into(), 2_147_483_647),
        "i64" | "isize" => range(i64::MIN.into(), 9_223_372_036_854_775_807),
        "i128" => range(i128::MIN, i128::MAX.unsigned_abs()),
        "u8" => range(0, u8::MAX.into()),
        "u16" => range(0, u16::MAX.into()),
        "u32" => range(0, u32::MAX.into()),
        "u64" | "usize" => range(0, u64::MAX.into()),
        "u128" => range(0, u128::MAX),
        "f32" | "f64" => "a number".to_owned(),
        "a sequence" => "a list".to_owned(),
        "unit" => "null".to_owned(),
        "option" => "a value".to_owned(),
        "field identifier" => "a field name".to_owned(),
        // serde_json's for an enum: the enums of gpu-guard's inputs are all names.
        "variant identifier" | "string or map" => "a string".to_owned(),
        "IntOrString" => "a whole number or a string".to_owned(),
        "Quantity" => "a quantity (such as \"1\", \"500m\" or \"16Gi\")".to_owned(),
        "Time" | "MicroTime" => "a time (RFC 3339, such as \"2026-01-02T15:04:05Z\")".to_owned(),
        other if is_struct(other) => "a map".to_owned(),
        other if other.starts_with("enum ") => "a string".to_owned(),
        // k8s-openapi names its types as the API does (`JobSpec`, `ObjectMeta`).
        other if is_type_name(other) => format!("a map ({other})"),
        other => other.to_owned(),
    }
}

/// A single CamelCase word: a type name rather than a description.
fn is_type_name(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_uppercase())
        && text.chars().all(|c| c.is_ascii_alphanumeric())
}
