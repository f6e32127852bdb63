//! The error of the Anthropic → SGLang chat conversion and the field helpers that
//! `anthropic.rs` and `anthropic_blocks.rs` share.

use serde_json::{Map, Value};

/// Why an Anthropic request has no chat kvgate can count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnthropicChatError {
    /// SGLang itself refuses it (its request model or conversion): a 400.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// SGLang would accept it, but how it becomes a prompt depends on the SGLang version or
    /// its server flags: kvgate refuses rather than guess a count.
    #[error("{path}: {reason}")]
    Unsupported { path: String, reason: String },
}

pub(super) type Converted<T> = Result<T, AnthropicChatError>;

pub(super) fn invalid(path: &str, message: impl Into<String>) -> AnthropicChatError {
    AnthropicChatError::Invalid {
        path: path.to_owned(),
        message: message.into(),
    }
}

pub(super) fn unsupported(path: &str, reason: impl Into<String>) -> AnthropicChatError {
    AnthropicChatError::Unsupported {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// A field's value, `None` when absent or null (pydantic's `Optional` takes null as unset).
pub(super) fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

/// The keys of an object other than `allowed`: refused (SGLang's models ignore them).
pub(super) fn only_keys(map: &Map<String, Value>, allowed: &[&str], path: &str) -> Converted<()> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(unsupported(
            &join(path, key),
            "an unknown field: SGLang ignores it, kvgate refuses it rather than guess",
        )),
        None => Ok(()),
    }
}

/// `path.key`, or `key` at the top.
pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A value of the wrong JSON type for a field kvgate models.
pub(super) fn wrong_type(path: &str, expected: &str) -> AnthropicChatError {
    unsupported(
        path,
        format!(
            "expected {expected}; how SGLang's request model coerces other values is not modelled"
        ),
    )
}
