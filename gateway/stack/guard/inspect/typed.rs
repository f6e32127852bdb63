//! A typed, borrowed reading of an OpenAI answer or stream chunk: what the guard's checks
//! read (choices' index, `finish_reason` and text, `usage`), without building a
//! `serde_json::Value` tree.
//!
//! Building the tree (a map and an owned string per key, the whole generated text copied)
//! was the largest part of the guard's own cost per answer, and most of a stream's. This
//! view reads the same fields in one pass, borrows the text where it has no escapes, and
//! skips the rest.
//!
//! It only has to be right when it parses: [`OpenAiAnswer::parse`] and
//! [`OpenAiChunk::parse`] refuse anything they do not read exactly like the tree path
//! (`super::check_openai`, `Answer::texts`, `Answer::usage`, `StreamCheck::openai`) — a body
//! that is not an object, an `error` that is not null, an `"object": "error"`, a duplicate
//! key, a choice, message, delta or (chunk) usage that is not an object — and the caller
//! then reads it as a tree. A field of an unexpected type is kept as
//! [`Loose::Other`], which reads like a tree value of that type (`as_str`, `as_u64`: none).

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// A JSON value of any type, as far as the checks read it.
#[derive(Debug, Default, PartialEq)]
pub(in crate::stack::guard) enum Loose<'a> {
    /// The key is absent.
    #[default]
    Missing,
    Null,
    Str(Cow<'a, str>),
    /// A non-negative integer (what `Value::as_u64` reads).
    U64(u64),
    /// Anything else: a bool, a negative or fractional number, an array, an object.
    Other,
}

impl<'a> Loose<'a> {
    pub(in crate::stack::guard) fn as_str(&self) -> Option<&str> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(in crate::stack::guard) fn as_u64(&self) -> Option<u64> {
        match self {
            Loose::U64(n) => Some(*n),
            _ => None,
        }
    }

    /// Present, whatever its value (`Value::get` returned `Some`).
    fn is_present(&self) -> bool {
        !matches!(self, Loose::Missing)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LooseVisitor;
        impl<'de> Visitor<'de> for LooseVisitor {
            type Value = Loose<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Loose::Str(Cow::Owned(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Loose::U64(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                // serde_json gives non-negative integers to visit_u64.
                Ok(u64::try_from(v).map_or(Loose::Other, Loose::U64))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Loose::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
        }
        deserializer.deserialize_any(LooseVisitor)
    }
}

/// `message` of a chat choice.
#[derive(Debug, Deserialize)]
pub(super) struct Message<'a> {
    #[serde(default, borrow)]
    pub(super) content: Loose<'a>,
}

/// One of `choices` (read by [`ChoiceSeen`]).
#[derive(Debug)]
pub(in crate::stack::guard) struct Choice<'a> {
    pub(in crate::stack::guard) finish_reason: Loose<'a>,
    pub(in crate::stack::guard) index: Loose<'a>,
    /// `None` when absent or null (the tree path reads no `content` from either).
    message: Option<Message<'a>>,
    /// A stream chunk's `message`.
    delta: Option<Message<'a>>,
    text: Loose<'a>,
}

impl Choice<'_> {
    /// The piece a stream chunk's checks read: `delta.content`, else `text`.
    pub(in crate::stack::guard) fn delta_text(&self) -> Option<&str> {
        match &self.delta {
            Some(d) if d.content.is_present() => d.content.as_str(),
            _ => self.text.as_str(),
        }
    }

    /// The text the marker check reads: `message.content`, else `text` (as the tree
    /// path: `message` present without `content` falls back to `text`).
    pub(super) fn marker_text(&self) -> Option<&str> {
        match &self.message {
            Some(m) if m.content.is_present() => m.content.as_str(),
            _ => self.text.as_str(),
        }
    }

    /// The text the leak scan reads: `text`, else `message.content`.
    pub(super) fn scan_text(&self) -> Option<&str> {
        if self.text.is_present() {
            return self.text.as_str();
        }
        self.message.as_ref().and_then(|m| m.content.as_str())
    }
}

/// `usage`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Usage<'a> {
    #[serde(default, borrow)]
    pub(super) prompt_tokens: Loose<'a>,
    #[serde(default, borrow)]
    pub(super) total_tokens: Loose<'a>,
}

/// The fields of an OpenAI answer the checks read.
#[derive(Debug, Deserialize)]
pub(super) struct OpenAiAnswer<'a> {
    #[serde(default, borrow)]
    error: Loose<'a>,
    #[serde(default, borrow)]
    object: Loose<'a>,
    #[serde(default, borrow)]
    pub(super) choices: Choices<'a>,
    #[serde(default, borrow, deserialize_with = "usage")]
    pub(super) usage: Option<Usage<'a>>,
}

/// A stream chunk of an OpenAI stream, as far as the stream checks read it. Refuses (like
/// [`OpenAiAnswer`]) what only the tree reads right, and a `usage` that is neither an
/// object nor null.
#[derive(Debug, Deserialize)]
pub(in crate::stack::guard) struct OpenAiChunk<'a> {
    #[serde(default, borrow)]
    error: Loose<'a>,
    #[serde(default, borrow)]
    object: Loose<'a>,
    #[serde(default, borrow)]
    pub(in crate::stack::guard) choices: Choices<'a>,
    #[serde(default, borrow, deserialize_with = "chunk_usage")]
    usage: ChunkUsageField<'a>,
}

/// A chunk's `usage`: absent, null, or an object (anything else refuses the view).
#[derive(Debug, Default)]
enum ChunkUsageField<'a> {
    #[default]
    Missing,
    Null,
    Object(Usage<'a>),
}

fn chunk_usage<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<ChunkUsageField<'a>, D::Error> {
    struct ChunkUsageVisitor;
    impl<'de> Visitor<'de> for ChunkUsageVisitor {
        type Value = ChunkUsageField<'de>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a usage object or null")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            Usage::deserialize(MapAccessDeserializer::new(map)).map(ChunkUsageField::Object)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(ChunkUsageField::Null)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(ChunkUsageField::Null)
        }
    }
    d.deserialize_any(ChunkUsageVisitor)
}

impl<'a> OpenAiChunk<'a> {
    /// The view of one event's `data`, or `None` when only the tree reads it right.
    pub(in crate::stack::guard) fn parse(data: &'a str) -> Option<Self> {
        let first = data.bytes().find(|b| !b.is_ascii_whitespace())?;
        if first != b'{' {
            return None;
        }
        let chunk: Self = serde_json::from_str(data).ok()?;
        if !matches!(chunk.error, Loose::Missing | Loose::Null)
            || chunk.object.as_str() == Some("error")
        {
            return None;
        }
        Some(chunk)
    }

    /// `Shape::is_event` for OpenAI: `choices` or `usage` present and not null.
    pub(in crate::stack::guard) fn is_event(&self) -> bool {
        !matches!(self.choices, Choices::Missing | Choices::Null) || self.has_usage()
    }

    /// `usage` present and not null.
    pub(in crate::stack::guard) fn has_usage(&self) -> bool {
        matches!(self.usage, ChunkUsageField::Object(_))
    }

    /// `usage.prompt_tokens` and `usage.total_tokens`, where numbers.
    pub(in crate::stack::guard) fn usage_tokens(&self) -> (Option<u64>, Option<u64>) {
        match &self.usage {
            ChunkUsageField::Object(u) => (u.prompt_tokens.as_u64(), u.total_tokens.as_u64()),
            _ => (None, None),
        }
    }
}

/// `choices`, as the tree path tells them apart.
#[derive(Debug, Default)]
pub(in crate::stack::guard) enum Choices<'a> {
    #[default]
    Missing,
    Null,
    Array(Vec<Choice<'a>>),
    /// Present, not an array: the tree reads no choices from it.
    Other,
}

impl<'a> Choices<'a> {
    /// The choices when they are an array (`get("choices").and_then(Value::as_array)`).
    pub(in crate::stack::guard) fn array(&self) -> Option<&[Choice<'a>]> {
        match self {
            Choices::Array(c) => Some(c),
            _ => None,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        choices(d)
    }
}

/// `choices`: an array of objects, null, or anything else (the tree path reads no choices
/// from a non-array). A non-object element makes the whole view refuse.
fn choices<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Choices<'a>, D::Error> {
    struct ChoicesVisitor;
    impl<'de> Visitor<'de> for ChoicesVisitor {
        type Value = Choices<'de>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("choices")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(1));
            while let Some(choice) = seq.next_element::<ChoiceSeen<'de>>()? {
                out.push(choice.0);
            }
            Ok(Choices::Array(out))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Choices::Null)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Choices::Null)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Choices::Other)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Choices::Other)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Choices::Other)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Choices::Other)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Choices::Other)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Choices::Other)
        }
    }
    d.deserialize_any(ChoicesVisitor)
}

/// `usage`: an object, or anything else (read as no usage; an array is not read by
/// position, as a derived struct would).
fn usage<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Usage<'a>>, D::Error> {
    struct UsageVisitor;
    impl<'de> Visitor<'de> for UsageVisitor {
        type Value = Option<Usage<'de>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("usage")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            Usage::deserialize(MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(UsageVisitor)
}

/// The keys of a choice the checks read.
enum ChoiceKey {
    FinishReason,
    Message,
    Text,
    Delta,
    Index,
    Other,
}

impl<'de> Deserialize<'de> for ChoiceKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = ChoiceKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(match v {
                    "finish_reason" => ChoiceKey::FinishReason,
                    "message" => ChoiceKey::Message,
                    "text" => ChoiceKey::Text,
                    "delta" => ChoiceKey::Delta,
                    "index" => ChoiceKey::Index,
                    _ => ChoiceKey::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// A choice: an object (anything else refuses the view), each key at most once.
struct ChoiceSeen<'a>(Choice<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for ChoiceSeen<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ChoiceVisitor;
        impl<'de> Visitor<'de> for ChoiceVisitor {
            type Value = ChoiceSeen<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a choice object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut choice = Choice {
                    finish_reason: Loose::Missing,
                    index: Loose::Missing,
                    message: None,
                    delta: None,
                    text: Loose::Missing,
                };
                let mut seen = [false; 5];
                while let Some(key) = map.next_key::<ChoiceKey>()? {
                    let slot = match key {
                        ChoiceKey::FinishReason => 0,
                        ChoiceKey::Message => 1,
                        ChoiceKey::Text => 2,
                        ChoiceKey::Delta => 3,
                        ChoiceKey::Index => 4,
                        ChoiceKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    // The tree keeps the last of duplicate keys; refuse rather than differ.
                    if std::mem::replace(&mut seen[slot], true) {
                        return Err(de::Error::custom("duplicate key"));
                    }
                    match slot {
                        0 => choice.finish_reason = map.next_value()?,
                        1 => choice.message = map.next_value::<MessageSlot<'de>>()?.0,
                        2 => choice.text = map.next_value()?,
                        3 => choice.delta = map.next_value::<MessageSlot<'de>>()?.0,
                        _ => choice.index = map.next_value()?,
                    }
                }
                Ok(ChoiceSeen(choice))
            }
        }
        d.deserialize_any(ChoiceVisitor)
    }
}

/// `message`: an object, or null (the tree path's `get("content")` on null is none, so it
/// falls back to `text` as when `message` is absent); anything else refuses the view.
struct MessageSlot<'a>(Option<Message<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for MessageSlot<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MessageVisitor;
        impl<'de> Visitor<'de> for MessageVisitor {
            type Value = MessageSlot<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object or null")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Message::deserialize(MapAccessDeserializer::new(map)).map(|m| MessageSlot(Some(m)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(MessageSlot(None))
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(MessageSlot(None))
            }
        }
        d.deserialize_any(MessageVisitor)
    }
}

impl<'a> OpenAiAnswer<'a> {
    /// The view of `body`, or `None` when only the tree reads it right (see the module docs).
    pub(super) fn parse(body: &'a [u8]) -> Option<Self> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
        if *first != b'{' {
            return None;
        }
        let answer: Self = serde_json::from_slice(body).ok()?;
        if !matches!(answer.error, Loose::Missing | Loose::Null)
            || answer.object.as_str() == Some("error")
        {
            return None;
        }
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{check_openai, Answer, Expectation, Markers, Parsed, Shape};
    use crate::config::GuardConfig;
    use proptest::prelude::*;
    use serde_json::Value;

    /// What the tree path reads from `body`: check outcome, usage, texts.
    fn tree(
        body: &[u8],
        markers: &Markers,
        expect: &Expectation,
    ) -> (String, Option<u64>, Vec<String>) {
        let answer = Answer(Parsed::Tree(serde_json::from_slice::<Value>(body).ok()));
        read(&answer, markers, expect)
    }

    fn read(
        answer: &Answer<'_>,
        markers: &Markers,
        expect: &Expectation,
    ) -> (String, Option<u64>, Vec<String>) {
        (
            format!("{:?}", answer.check(Shape::OpenAi, markers, expect)),
            answer.usage(Shape::OpenAi),
            answer
                .texts(Shape::OpenAi)
                .into_iter()
                .map(str::to_owned)
                .collect(),
        )
    }

    fn markers() -> Markers {
        Markers::from_config(&GuardConfig {
            markers: vec!["PLACEHOLDER".into()],
            ..GuardConfig::default()
        })
    }

    fn expect() -> Expectation {
        Expectation {
            prompt_tokens: Some(vec![7].into()),
            tolerance: 0,
        }
    }

    fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
        prop::option::weighted(0.8, prop::sample::select(values).prop_map(str::to_owned))
    }

    /// Fields in a shuffled order, each maybe absent, sometimes one twice.
    fn object(fields: Vec<(&'static str, Option<String>)>, dup: bool, order: usize) -> String {
        let mut present: Vec<String> = fields
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("\"{k}\":{v}")))
            .collect();
        if !present.is_empty() {
            let n = present.len();
            present.rotate_left(order % n);
            if dup {
                present.push(present[0].clone());
            }
        }
        format!("{{{}}}", present.join(","))
    }

    const FINISH: &[&str] = &[
        "\"stop\"",
        "\"length\"",
        "\"abort\"",
        "\"error\"",
        "null",
        "7",
        "{}",
    ];
    const TEXT: &[&str] = &[
        "\"t\"",
        "\"a PLACEHOLDER here\"",
        "\"esc\\u0061ped \\\"PLACEHOLDER\\\"\"",
        "null",
        "5",
        "[\"PLACEHOLDER\"]",
    ];
    const MESSAGE: &[&str] = &[
        "{\"role\":\"assistant\",\"content\":\"hi\"}",
        "{\"content\":\"PLACEHOLDER\"}",
        "{\"content\":null}",
        "{\"content\":7}",
        "{}",
        "null",
        "\"x\"",
        "[\"PLACEHOLDER\"]",
        "{\"content\":\"PLACEHOLDER\",\"content\":\"ok\"}",
    ];
    const USAGE: &[&str] = &[
        "{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}",
        "{\"prompt_tokens\":8,\"total_tokens\":9}",
        "{\"prompt_tokens\":-7,\"total_tokens\":9.0}",
        "{\"prompt_tokens\":\"7\"}",
        "{\"prompt_tokens\":7,\"prompt_tokens\":8}",
        "[7,9]",
        "null",
        "7",
    ];
    const OTHER: &[&str] = &[
        "null",
        "\"chat.completion\"",
        "\"error\"",
        "{\"message\":\"boom\",\"code\":500}",
        "7",
    ];

    fn choice() -> impl Strategy<Value = String> {
        let object = (
            one_of(FINISH),
            one_of(MESSAGE),
            one_of(TEXT),
            one_of(&["0"]),
            any::<bool>(),
            0..4usize,
        )
            .prop_map(|(f, m, t, i, dup, order)| {
                object(
                    vec![
                        ("finish_reason", f),
                        ("message", m),
                        ("text", t),
                        ("index", i),
                    ],
                    dup && order == 0,
                    order,
                )
            });
        prop_oneof![8 => object, 1 => prop::sample::select(&["null", "\"x\"", "7", "[]"][..]).prop_map(str::to_owned)]
    }

    fn answer() -> impl Strategy<Value = String> {
        let choices = prop_oneof![
            8 => prop::collection::vec(choice(), 0..3).prop_map(|c| format!("[{}]", c.join(","))),
            1 => prop::sample::select(&["null", "{}", "\"x\""][..]).prop_map(str::to_owned),
        ];
        let error =
            prop::option::weighted(0.15, prop::sample::select(OTHER).prop_map(str::to_owned));
        let object_field =
            prop::option::weighted(0.5, prop::sample::select(OTHER).prop_map(str::to_owned));
        (
            choices,
            one_of(USAGE),
            object_field,
            error,
            one_of(&["\"x\""]),
            any::<bool>(),
            0..4usize,
        )
            .prop_map(|(c, u, object_field, error, id, dup, order)| {
                object(
                    vec![
                        ("choices", Some(c)),
                        ("usage", u),
                        ("object", object_field),
                        ("error", error),
                        ("id", id),
                    ],
                    dup && order == 1,
                    order,
                )
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn the_typed_view_reads_every_answer_as_the_tree_does(body in answer()) {
            let (markers, expect) = (markers(), expect());
            let want = tree(body.as_bytes(), &markers, &expect);
            let answer = Answer::parse(body.as_bytes(), Shape::OpenAi);
            prop_assert_eq!(read(&answer, &markers, &expect), want, "{}", body);
        }
    }

    #[test]
    fn the_equivalence_test_exercises_the_typed_view() {
        // The property above only means something if many generated answers take the
        // typed path rather than falling back to the tree.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut typed, total) = (0, 512);
        for _ in 0..total {
            let body = answer().new_tree(&mut runner).unwrap().current();
            typed += usize::from(matches!(
                Answer::parse(body.as_bytes(), Shape::OpenAi).0,
                Parsed::OpenAi(_)
            ));
        }
        assert!(
            typed * 4 > total,
            "only {typed} of {total} answers took the typed view"
        );
    }

    #[test]
    fn the_typed_view_takes_the_usual_answer_and_leaves_the_rest_to_the_tree() {
        let usual = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}"#;
        assert!(matches!(
            Answer::parse(usual, Shape::OpenAi).0,
            Parsed::OpenAi(_)
        ));
        for other in [
            &br#"[{"choices":[]}]"#[..],
            br#"{"error":{"message":"x"},"choices":[]}"#,
            br#"{"object":"error","message":"x"}"#,
            br#"{"choices":[],"choices":[{"finish_reason":"stop"}]}"#,
            br#"{"choices":["x"]}"#,
            br#"{"choices":[{"message":"x"}]}"#,
            br#"not json"#,
        ] {
            assert!(
                matches!(Answer::parse(other, Shape::OpenAi).0, Parsed::Tree(_)),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
        // A native answer is never read as an OpenAI one.
        assert!(matches!(
            Answer::parse(usual, Shape::Native).0,
            Parsed::Tree(_)
        ));
        // The tree path, for reference, on the usual answer.
        let v: Value = serde_json::from_slice(usual).unwrap();
        assert!(check_openai(&v, &markers(), &expect()).is_ok());
    }
}
