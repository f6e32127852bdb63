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

mod de;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use crate::accounting::TokenUsage;

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

impl Loose<'_> {
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

    /// Absent or null: what an `error` must be for the view to read the rest.
    fn is_none(&self) -> bool {
        matches!(self, Loose::Missing | Loose::Null)
    }
}

/// A field that the checks read as an object: absent, null, an object, or anything else.
#[derive(Debug, Default)]
pub(in crate::stack::guard) enum ObjectField<T> {
    #[default]
    Missing,
    Null,
    Object(T),
    Other,
}

impl<T> ObjectField<T> {
    fn object(&self) -> Option<&T> {
        match self {
            ObjectField::Object(t) => Some(t),
            _ => None,
        }
    }
}

/// `message` of a chat choice, or `delta` of a chunk's.
#[derive(Debug, serde::Deserialize)]
pub(in crate::stack::guard) struct Message<'a> {
    #[serde(default, borrow)]
    content: Loose<'a>,
}

/// One of `choices` (read by `de::ChoiceSeen`).
#[derive(Debug, Default)]
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
        content_else_text(&self.delta, &self.text)
    }

    /// The text the marker check reads: `message.content`, else `text` (as the tree
    /// path: `message` present without `content` falls back to `text`).
    pub(super) fn marker_text(&self) -> Option<&str> {
        content_else_text(&self.message, &self.text)
    }

    /// The text the leak scan reads: `text`, else `message.content`.
    pub(super) fn scan_text(&self) -> Option<&str> {
        if self.text.is_present() {
            return self.text.as_str();
        }
        self.message.as_ref().and_then(|m| m.content.as_str())
    }
}

/// `m.content` when `m` has the key (even as a non-string), else `text`.
fn content_else_text<'t>(m: &'t Option<Message<'_>>, text: &'t Loose<'_>) -> Option<&'t str> {
    match m {
        Some(m) if m.content.is_present() => m.content.as_str(),
        _ => text.as_str(),
    }
}

/// `usage`.
#[derive(Debug, Default, serde::Deserialize)]
pub(in crate::stack::guard) struct Usage<'a> {
    #[serde(default, borrow)]
    prompt_tokens: Loose<'a>,
    #[serde(default, borrow)]
    total_tokens: Loose<'a>,
    /// Read for the tenant's account only (the checks do not look at it).
    #[serde(default, borrow)]
    completion_tokens: Loose<'a>,
    #[serde(default, borrow)]
    prompt_tokens_details: ObjectField<UsageDetails<'a>>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Default, serde::Deserialize)]
pub(in crate::stack::guard) struct UsageDetails<'a> {
    #[serde(default, borrow)]
    cached_tokens: Loose<'a>,
}

impl Usage<'_> {
    /// The split the tenant counters take (`TokenUsage::from_usage` on the tree).
    fn token_usage(&self) -> Option<TokenUsage> {
        let (prompt, completion) = (self.prompt_tokens.as_u64(), self.completion_tokens.as_u64());
        if prompt.is_none() && completion.is_none() {
            return None;
        }
        Some(TokenUsage {
            prompt: prompt.unwrap_or(0),
            completion: completion.unwrap_or(0),
            cached: self
                .prompt_tokens_details
                .object()
                .and_then(|d| d.cached_tokens.as_u64())
                .unwrap_or(0),
        })
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

/// The fields of an OpenAI answer the checks read.
#[derive(Debug, serde::Deserialize)]
pub(super) struct OpenAiAnswer<'a> {
    #[serde(default, borrow)]
    error: Loose<'a>,
    #[serde(default, borrow)]
    object: Loose<'a>,
    #[serde(default, borrow)]
    pub(super) choices: Choices<'a>,
    /// Anything but an object reads as no usage (an array is not read by position).
    #[serde(default, borrow)]
    usage: ObjectField<Usage<'a>>,
}

impl<'a> OpenAiAnswer<'a> {
    /// The view of `body`, or `None` when only the tree reads it right (see the module docs).
    pub(super) fn parse(body: &'a [u8]) -> Option<Self> {
        if !starts_an_object(body) {
            return None;
        }
        let answer: Self = serde_json::from_slice(body).ok()?;
        (!is_error(&answer.error, &answer.object)).then_some(answer)
    }

    /// `usage.prompt_tokens`, where a number.
    pub(super) fn prompt_tokens(&self) -> Option<u64> {
        self.usage.object()?.prompt_tokens.as_u64()
    }

    /// `usage.total_tokens`, where a number.
    pub(super) fn total_tokens(&self) -> Option<u64> {
        self.usage.object()?.total_tokens.as_u64()
    }

    /// The usage split for the tenant's account.
    pub(super) fn token_usage(&self) -> Option<TokenUsage> {
        self.usage.object()?.token_usage()
    }
}

/// A stream chunk of an OpenAI stream, as far as the stream checks read it. Refuses (like
/// [`OpenAiAnswer`]) what only the tree reads right, and a `usage` that is neither an
/// object nor null.
#[derive(Debug, serde::Deserialize)]
pub(in crate::stack::guard) struct OpenAiChunk<'a> {
    #[serde(default, borrow)]
    error: Loose<'a>,
    #[serde(default, borrow)]
    object: Loose<'a>,
    #[serde(default, borrow)]
    pub(in crate::stack::guard) choices: Choices<'a>,
    #[serde(default, borrow)]
    usage: ObjectField<Usage<'a>>,
}

impl<'a> OpenAiChunk<'a> {
    /// The view of one event's `data`, or `None` when only the tree reads it right.
    pub(in crate::stack::guard) fn parse(data: &'a str) -> Option<Self> {
        if !starts_an_object(data.as_bytes()) {
            return None;
        }
        let chunk: Self = serde_json::from_str(data).ok()?;
        let refused =
            is_error(&chunk.error, &chunk.object) || matches!(chunk.usage, ObjectField::Other);
        (!refused).then_some(chunk)
    }

    /// `Shape::is_event` for OpenAI: `choices` or `usage` present and not null.
    pub(in crate::stack::guard) fn is_event(&self) -> bool {
        !matches!(self.choices, Choices::Missing | Choices::Null) || self.has_usage()
    }

    /// `usage` present and not null.
    pub(in crate::stack::guard) fn has_usage(&self) -> bool {
        self.usage.object().is_some()
    }

    /// The usage split for the tenant's account.
    pub(in crate::stack::guard) fn token_usage(&self) -> Option<TokenUsage> {
        self.usage.object()?.token_usage()
    }

    /// `usage.prompt_tokens` and `usage.total_tokens`, where numbers.
    pub(in crate::stack::guard) fn usage_tokens(&self) -> (Option<u64>, Option<u64>) {
        match self.usage.object() {
            Some(u) => (u.prompt_tokens.as_u64(), u.total_tokens.as_u64()),
            None => (None, None),
        }
    }
}

/// The first non-space byte opens an object (a derived struct would also read an array,
/// by position).
fn starts_an_object(body: &[u8]) -> bool {
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// An `error` that is not null, or `"object": "error"`: the tree path's `error_object`.
fn is_error(error: &Loose<'_>, object: &Loose<'_>) -> bool {
    !error.is_none() || object.as_str() == Some("error")
}
