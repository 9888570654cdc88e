//! A second decode, made only after the first one failed, that sees the problem as serde hands
//! it to the error type: which value was found ([`Unexpected`], typed) and what the type being
//! decoded expected. serde_json's and serde_norway's deserializers make their errors as text at
//! once; this one is generic over the error type, so [`Problem`] records the parts instead.
//!
//! The input is first read into a [`Node`] (by any deserializer: JSON text, a `serde_json`
//! value, YAML), then decoded from it. Where the two decodes could disagree (a `RawValue`, a
//! YAML tag), the caller compares the field each reports and keeps the first decode's message
//! when they differ.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, MapDeserializer, SeqDeserializer};
use serde::de::{
    self, Deserialize, Deserializer, Error as _, IntoDeserializer, Unexpected, Visitor,
};

use super::problem::Problem;

/// A decoded value of any shape, as a deserializer presented it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Node {
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    /// An integer beyond 64 bits (YAML allows them).
    Wide(i128),
    Float(f64),
    Char(char),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Signed(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Unsigned(v))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Wide(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        i128::try_from(v)
            .map(Node::Wide)
            .map_err(|_| E::custom("an integer beyond 128 bits"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_char<E>(self, v: char) -> Result<Node, E> {
        Ok(Node::Char(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
}

/// Which input a [`Node`] was read from: YAML reads a plain scalar as an enum's variant name
/// whatever it looks like (`mode: 5` names the variant `5`), JSON only a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    Json,
    Yaml,
}

/// Decodes from a [`Node`], with [`Problem`] as the error type.
#[derive(Clone, Copy)]
pub(super) struct NodeDeserializer<'a> {
    node: &'a Node,
    source: Source,
}

impl<'a> NodeDeserializer<'a> {
    pub(super) fn new(node: &'a Node, source: Source) -> Self {
        Self { node, source }
    }

    /// `result`, with the number put back in when this node is an integer beyond 64 bits:
    /// serde's visitors report one only as "an integer".
    fn about<T>(self, result: Result<T, Problem>) -> Result<T, Problem> {
        match self.node {
            Node::Wide(value) => result.map_err(|problem| problem.found_integer(*value)),
            _ => result,
        }
    }

    fn child(self, node: &'a Node) -> Self {
        Self::new(node, self.source)
    }

    fn unexpected(self) -> Unexpected<'a> {
        match self.node {
            Node::Null => Unexpected::Unit,
            Node::Bool(v) => Unexpected::Bool(*v),
            Node::Unsigned(v) => Unexpected::Unsigned(*v),
            Node::Signed(v) => Unexpected::Signed(*v),
            Node::Wide(_) => Unexpected::Other("integer"),
            Node::Float(v) => Unexpected::Float(*v),
            Node::Char(v) => Unexpected::Char(*v),
            Node::Str(v) => Unexpected::Str(v),
            Node::Seq(_) => Unexpected::Seq,
            Node::Map(_) => Unexpected::Map,
        }
    }
}

impl<'de, 'a> IntoDeserializer<'de, Problem> for NodeDeserializer<'a> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for NodeDeserializer<'_> {
    type Error = Problem;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Problem> {
        match self.node {
            Node::Null => visitor.visit_unit(),
            Node::Bool(v) => visitor.visit_bool(*v),
            Node::Unsigned(v) => visitor.visit_u64(*v),
            Node::Signed(v) => visitor.visit_i64(*v),
            Node::Wide(v) => self.about(visitor.visit_i128(*v)),
            Node::Float(v) => visitor.visit_f64(*v),
            Node::Char(v) => visitor.visit_char(*v),
            Node::Str(v) => visitor.visit_str(v),
            Node::Seq(items) => {
                let mut seq = SeqDeserializer::new(items.iter().map(|item| self.child(item)));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Node::Map(entries) => {
                let mut map = MapDeserializer::new(
                    entries
                        .iter()
                        .map(|(key, value)| (self.child(key), self.child(value))),
                );
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Problem> {
        match self.node {
            Node::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Problem> {
        match self.node {
            Node::Null => visitor.visit_unit(),
            _ => self.about(Err(Problem::invalid_type(self.unexpected(), &visitor))),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Problem> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Problem> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Problem> {
        let scalar = match (self.node, self.source) {
            (Node::Str(name), _) => Some(name.clone()),
            (Node::Map(entries), _) if entries.len() == 1 => {
                let map = MapDeserializer::new(
                    entries
                        .iter()
                        .map(|(key, value)| (self.child(key), self.child(value))),
                );
                return visitor.visit_enum(MapAccessDeserializer::new(map));
            }
            (Node::Bool(v), Source::Yaml) => Some(v.to_string()),
            (Node::Unsigned(v), Source::Yaml) => Some(v.to_string()),
            (Node::Signed(v), Source::Yaml) => Some(v.to_string()),
            (Node::Wide(v), Source::Yaml) => Some(v.to_string()),
            (Node::Float(v), Source::Yaml) => Some(v.to_string()),
            _ => None,
        };
        match scalar {
            Some(name) => visitor.visit_enum(IntoDeserializer::<Problem>::into_deserializer(name)),
            None => self.about(Err(Problem::invalid_type(self.unexpected(), &visitor))),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Problem> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        seq tuple tuple_struct map struct identifier
    }
}
