//! The client's body, split once: its bulk fields (the prompt, chat `tools`) stay where they
//! are, as byte ranges of the body the client sent, and are spliced into the engine's body
//! unchanged; every other (small) field is parsed into a `serde_json::Value` for the stages.
//!
//! A 2 KB chat is almost all prompt. Parsing it into a value tree (a `String` per message,
//! an index map per object) and serialising it again for the engine was a fifth of the
//! gateway's own work per request; the stages only ever *read* the prompt, and do so
//! through borrowed views (`api::prompt`), so the bytes never need to be rebuilt.
//!
//! A top-level field given twice is refused: with the prompt spliced from the client's own
//! bytes, "which of the two did the gateway count" must never have two answers.

use bytes::Bytes;
use serde::de::{DeserializeSeed, Error as _, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use crate::error::GatewayError;

/// The bulk fields of one body: (name, byte range of its JSON value in the body).
#[derive(Debug, Clone, Default)]
pub struct RawFields {
    body: Bytes,
    spans: Vec<(&'static str, Range<usize>)>,
}

impl RawFields {
    /// The JSON text of bulk field `name`, exactly as the client sent it.
    pub fn get(&self, name: &str) -> Option<&str> {
        let (_, span) = self.spans.iter().find(|(n, _)| *n == name)?;
        // The range was a `RawValue` of this body, so it is UTF-8; checked again (cheaply)
        // rather than trusted with `unsafe`.
        std::str::from_utf8(self.body.get(span.clone())?).ok()
    }

    /// Whether the client sent bulk field `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.spans.iter().any(|(n, _)| *n == name)
    }

    /// Every bulk field, in the order the client sent them.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &[u8])> {
        self.spans
            .iter()
            .filter_map(|(n, span)| Some((*n, self.body.get(span.clone())?)))
    }

    /// Bulk fields made from parsed values (tests and probes that build requests in code).
    pub fn from_values(values: &[(&'static str, &Value)]) -> Self {
        let mut text = Vec::new();
        let mut spans = Vec::new();
        for (name, value) in values {
            let start = text.len();
            // A `Value` always serialises.
            let _ = serde_json::to_writer(&mut text, value);
            spans.push((*name, start..text.len()));
        }
        Self {
            body: Bytes::from(text),
            spans,
        }
    }
}

/// Split `body` (a JSON object) into its small fields, parsed, and the fields named in
/// `bulk`, left as ranges of `body`.
pub fn split(
    body: &Bytes,
    bulk: &'static [&'static str],
) -> Result<(Map<String, Value>, RawFields), GatewayError> {
    let mut duplicate = None;
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = TopLevel {
        base: body.as_ptr() as usize,
        bulk,
        duplicate: &mut duplicate,
    }
    .deserialize(&mut de)
    .and_then(|split| de.end().map(|()| split));
    match parsed {
        Ok((fields, spans)) => Ok((
            fields,
            RawFields {
                body: body.clone(),
                spans,
            },
        )),
        Err(_) if duplicate.is_some() => {
            let name = duplicate.unwrap_or_default();
            Err(GatewayError::invalid(
                format!("`{name}` appears more than once in the request body: send it once"),
                Some(&name),
            ))
        }
        Err(e) if e.classify() == serde_json::error::Category::Data => Err(GatewayError::invalid(
            "request body must be a JSON object",
            None,
        )),
        Err(e) => Err(GatewayError::invalid(
            format!("request body is not valid JSON: {e}"),
            None,
        )),
    }
}

type Split = (Map<String, Value>, Vec<(&'static str, Range<usize>)>);

struct TopLevel<'d> {
    base: usize,
    bulk: &'static [&'static str],
    duplicate: &'d mut Option<String>,
}

/// A key, borrowed from the body unless it has escapes.
#[derive(serde::Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> DeserializeSeed<'de> for TopLevel<'_> {
    type Value = Split;

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<Split, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = Split;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Split, A::Error> {
        let mut fields = Map::new();
        let mut spans: Vec<(&'static str, Range<usize>)> = Vec::new();
        while let Some(Key(name)) = map.next_key::<Key<'de>>()? {
            let seen = fields.contains_key(name.as_ref())
                || spans.iter().any(|(n, _)| *n == name.as_ref());
            if seen {
                *self.duplicate = Some(name.into_owned());
                return Err(A::Error::custom("duplicate field"));
            }
            match self.bulk.iter().find(|b| **b == name.as_ref()) {
                Some(bulk) => {
                    let raw: &'de RawValue = map.next_value()?;
                    let text = raw.get();
                    let start = (text.as_ptr() as usize).wrapping_sub(self.base);
                    spans.push((bulk, start..start + text.len()));
                }
                None => {
                    let value: Value = map.next_value()?;
                    fields.insert(name.into_owned(), value);
                }
            }
        }
        Ok((fields, spans))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BULK: &[&str] = &["messages", "tools"];

    fn split_str(body: &str) -> Result<(Map<String, Value>, RawFields), GatewayError> {
        split(&Bytes::copy_from_slice(body.as_bytes()), BULK)
    }

    #[test]
    fn bulk_fields_are_the_clients_exact_bytes() {
        let body =
            r#"{"model":"m", "messages" : [ {"role":"user","content":"a\u00e9 \"q\""} ] ,"n":2}"#;
        let (fields, raw) = split_str(body).unwrap();
        assert_eq!(
            raw.get("messages"),
            Some(r#"[ {"role":"user","content":"a\u00e9 \"q\""} ]"#)
        );
        assert!(raw.get("tools").is_none() && !raw.contains("tools"));
        assert_eq!(fields.keys().collect::<Vec<_>>(), ["model", "n"]);
        assert_eq!(fields["n"], 2);
    }

    #[test]
    fn escaped_keys_are_recognised() {
        let (fields, raw) = split_str(r#"{"mess\u0061ges":[1],"\u006d":true}"#).unwrap();
        assert_eq!(raw.get("messages"), Some("[1]"));
        assert_eq!(fields["m"], true);
    }

    #[test]
    fn a_field_given_twice_is_refused_by_name() {
        for body in [
            r#"{"messages":[],"messages":[{"role":"user"}]}"#,
            r#"{"model":"a","model":"b"}"#,
        ] {
            match split_str(body).unwrap_err() {
                GatewayError::InvalidRequest { message, .. } => {
                    assert!(message.contains("more than once"), "{message}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn non_objects_and_broken_json_are_invalid_requests() {
        for (body, says) in [
            ("[1]", "must be a JSON object"),
            ("\"x\"", "must be a JSON object"),
            ("{", "not valid JSON"),
            (r#"{"a":1} x"#, "not valid JSON"),
            (r#"{"messages":[1,]}"#, "not valid JSON"),
        ] {
            match split_str(body).unwrap_err() {
                GatewayError::InvalidRequest { message, .. } => {
                    assert!(message.contains(says), "{body}: {message}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn values_round_trip_through_from_values() {
        let v = serde_json::json!([{"role": "user", "content": "x"}]);
        let raw = RawFields::from_values(&[("messages", &v)]);
        let back: Value = serde_json::from_str(raw.get("messages").unwrap()).unwrap();
        assert_eq!(back, v);
        assert_eq!(raw.iter().count(), 1);
    }
}
