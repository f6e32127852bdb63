//! Errors of the tokenizer module.

use std::path::PathBuf;

/// Why loading a tokenizer, encoding, decoding or rendering a chat template failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// A tokenizer file could not be read or parsed.
    #[error("cannot load {path}: {reason}")]
    Load {
        /// The file that failed.
        path: PathBuf,
        /// What went wrong, as reported by the parser.
        reason: String,
    },
    /// The tokenizer refused to encode the input.
    #[error("encode failed: {0}")]
    Encode(String),
    /// The tokenizer refused to decode the ids.
    #[error("decode failed: {0}")]
    Decode(String),
    /// The model ships no chat template, so chat messages cannot be rendered.
    #[error("the tokenizer has no chat template")]
    NoChatTemplate,
    /// The chat template called `raise_exception(message)`; the message is the template's own.
    #[error("{0}")]
    TemplateRaised(String),
    /// The engine refuses the request before rendering it (its own message, e.g. SGLang's
    /// "Tools cannot be empty if tool choice is set to required.").
    #[error("{0}")]
    Refused(String),
    /// The chat template failed to compile or render.
    #[error("chat template error: {0}")]
    Template(String),
}
