//! A chat request prepared as its engine prepares it, before the template renders it.
//!
//! Engines do not hand a client's `messages` to the chat template as they are: each parses
//! the request into its own models (dropping unknown keys, adding defaults), joins or keeps
//! content parts depending on the template, parses tool-call arguments, filters tools by
//! `tool_choice`, turns reasoning options into template variables and handles a trailing
//! assistant turn its own way. The prompt's token count is the count of *that* render, so
//! kvgate (and its simulated engine) prepares every chat by the rules of the engine kind
//! that will serve it ([`ChatRules`]), each mirrored from the engine's source in its module:
//! [`sglang`], [`vllm`], [`llama_cpp`].
//!
//! What the engine would refuse is refused here with the engine's own message
//! ([`TokenizeError::Refused`]); a template's `raise_exception` surfaces as
//! [`TokenizeError::TemplateRaised`].

pub mod anthropic;
mod anthropic_blocks;
mod anthropic_fields;
pub mod content_format;
pub mod fields;
mod llama_caps;
pub(crate) mod llama_cpp;
pub mod media;
pub mod responses;
mod responses_items;
mod schema;
mod sglang;
mod tools;
mod vllm;
mod vllm_tools;

use serde_json::{Map, Value};

pub use content_format::ContentFormat;
pub use media::{MediaKind, MediaPart, ModelInput, MultimodalPrompt};
pub use responses::{responses_to_chat, ResponsesChat, ResponsesError, ResponsesPrompt};

pub(crate) use crate::template::Dialect;
use crate::TokenizeError;

/// Which engine's rules prepare a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRules {
    /// SGLang's OpenAI server (`serving_chat.py`).
    Sglang,
    /// vLLM's OpenAI server (`chat_utils.py`, `serving_chat.py`).
    Vllm,
    /// llama.cpp's `llama-server` with `--jinja` (`utils.hpp`, `common/chat.cpp`).
    LlamaCpp,
}

impl std::str::FromStr for ChatRules {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sglang" => Ok(ChatRules::Sglang),
            "vllm" => Ok(ChatRules::Vllm),
            "llama_cpp" => Ok(ChatRules::LlamaCpp),
            other => Err(format!("`{other}` is not sglang, vllm or llama_cpp")),
        }
    }
}

impl ChatRules {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatRules::Sglang => "sglang",
            ChatRules::Vllm => "vllm",
            ChatRules::LlamaCpp => "llama_cpp",
        }
    }
}

/// The parts of a chat completions request that shape its prompt, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct ChatRequest<'a> {
    /// `messages`, as the client sent them.
    pub messages: &'a Value,
    /// `tools` (None when absent).
    pub tools: Option<&'a Value>,
    /// The request's other top-level fields (`tool_choice`, `chat_template_kwargs`,
    /// `reasoning_effort`, `continue_final_message`, ...).
    pub fields: &'a Map<String, Value>,
}

impl<'a> ChatRequest<'a> {
    /// A whole request body (an object holding `messages` and the rest).
    pub fn from_body(body: &'a Map<String, Value>) -> Option<Self> {
        Some(Self {
            messages: body.get("messages")?,
            tools: body.get("tools").filter(|t| !t.is_null()),
            fields: body,
        })
    }

    fn field(&self, name: &str) -> Option<&'a Value> {
        self.fields.get(name)
    }

    /// `continue_final_message` (a boolean; absent or null is false).
    fn continue_final_message(&self) -> Result<bool, TokenizeError> {
        match self.field("continue_final_message") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(refused("continue_final_message must be a boolean")),
        }
    }
}

/// Top-level request fields (besides `messages` and `tools`) that some engine's
/// preparation reads.
pub const PROMPT_FIELDS: [&str; 7] = [
    "tool_choice",
    "chat_template_kwargs",
    "reasoning_effort",
    "reasoning",
    "continue_final_message",
    "add_generation_prompt",
    "parallel_tool_calls",
];

/// The request's fields besides `messages` and `tools` that shape the prompt, with the
/// rules, as one text (the chat count cache's key part).
pub fn options_key(rules: ChatRules, fields: &Map<String, Value>) -> String {
    let mut key = String::from(rules.as_str());
    for name in PROMPT_FIELDS {
        if let Some(value) = fields.get(name).filter(|v| !v.is_null()) {
            key.push('\n');
            key.push_str(name);
            key.push('=');
            key.push_str(&value.to_string());
        }
    }
    key
}

/// How the end of the prompt is formed after the template's render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Continuation {
    /// The render is the whole prompt.
    None,
    /// SGLang: this text is encoded on its own (with special tokens, less one leading BOS)
    /// and its ids appended to the render's.
    AppendEncoded(String),
    /// transformers' `continue_final_message` (vLLM): the render is cut at the tag the
    /// preparation put after the final message's text.
    CutAtTag,
    /// llama.cpp's prefill: the final message is not rendered; the template's own
    /// generation prompt and the message's text are appended to the render of the rest.
    AfterGenerationPrompt(LlamaContinuation),
}

/// What llama.cpp appends to continue a final message (`common_chat_templates_apply_jinja`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LlamaContinuation {
    /// The reasoning block's opening and closing tags, when the template has one.
    pub(crate) reasoning_tags: Option<(String, String)>,
    /// The message's reasoning (continued inside the block when there is no content).
    pub(crate) reasoning: String,
    /// The message's content (None: the reasoning is continued).
    pub(crate) content: Option<String>,
    /// The message holds nothing: the render of the rest is the whole prompt.
    pub(crate) empty: bool,
}

/// How transformers treats message keys before rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Normalize {
    /// As given (transformers 5.19, SGLang's pin).
    AsGiven,
    /// Reasoning fields aliased (`thinking`, `reasoning_content`), nulls kept (5.16–5.22).
    AliasReasoning,
}

/// What reaches the template.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub(crate) messages: Value,
    pub(crate) tools: Option<Value>,
    /// SGLang renders again, with each tool reduced to its `function`, when the first
    /// render fails (`_apply_jinja_template`).
    pub(crate) retry_with_functions: bool,
    /// Template variables beside `messages`, `tools` and `add_generation_prompt`.
    pub(crate) variables: Map<String, Value>,
    pub(crate) add_generation_prompt: bool,
    pub(crate) continuation: Continuation,
    pub(crate) normalize: Normalize,
    /// The render is encoded with special tokens (vLLM's `add_special_tokens`, llama.cpp).
    pub(crate) add_special_tokens: bool,
    /// The Jinja engine whose behaviour the render follows.
    pub(crate) dialect: Dialect,
    /// The media parts whose placeholders the messages hold, in order (SGLang's rules for
    /// a multimodal model; empty otherwise).
    pub(crate) media: Vec<MediaPart>,
}

/// A chat's prompt, as the engine tokenizes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The template's render (after any cut).
    pub rendered: String,
    /// Whether the render is encoded with special tokens (else without).
    pub add_special_tokens: bool,
    /// Text encoded separately and appended (SGLang's `continue_final_message`).
    pub appended: Option<String>,
    /// Special tokens the engine puts many times where `rendered` has one (an image's pad
    /// or soft tokens), in order of their occurrence: counted and expanded in the ids
    /// without tokenizing thousands of copies of one token. Empty for text.
    pub repeats: Vec<TokenRepeat>,
}

/// The `extra` more copies of `token` at its next occurrence in a prompt's ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRepeat {
    pub token: u32,
    pub extra: u32,
}

/// A message's content as one text: a string as it is, the text of its parts joined with
/// `separator`.
pub(crate) fn content_text(content: Option<&Value>, separator: &str) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(separator),
        _ => String::new(),
    }
}

/// An engine's refusal of the request, with its message.
pub(crate) fn refused(message: impl Into<String>) -> TokenizeError {
    TokenizeError::Refused(message.into())
}

/// Prepare `request` by `rules` for a template of content format `format` and a model that
/// takes `input`. Only SGLang's rules take media parts for a multimodal model so far; vLLM's
/// and llama.cpp's refuse them as for a text-only one.
pub(crate) fn prepare(
    rules: ChatRules,
    request: &ChatRequest<'_>,
    format: &Formats,
    input: ModelInput,
) -> Result<Prepared, TokenizeError> {
    match rules {
        ChatRules::Sglang => sglang::prepare(request, format.sglang, input),
        ChatRules::Vllm => vllm::prepare(request, format.vllm, format.mentions_developer),
        ChatRules::LlamaCpp => llama_cpp::prepare(request, &format.llama_cpp),
    }
}

/// A template's content format as each engine detects it (their detectors differ).
#[derive(Debug, Clone)]
pub(crate) struct Formats {
    pub(crate) sglang: ContentFormat,
    pub(crate) vllm: ContentFormat,
    /// The template names the `developer` role (vLLM then leaves such turns alone).
    pub(crate) mentions_developer: bool,
    /// What llama.cpp probes of the template at load.
    pub(crate) llama_cpp: llama_cpp::Caps,
}

/// transformers' `continue_final_message` cut (`render_jinja_template`): the render ends
/// at the tag placed after the final message's text (trailing space trimmed when the
/// template trimmed the tag's own space).
pub(crate) fn cut_at_tag(rendered: &str) -> Result<String, TokenizeError> {
    let tag = vllm::CONTINUE_TAG;
    let Some(at) = rendered.rfind(tag) else {
        return Err(refused("continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible."));
    };
    if rendered[at + tag.len()..].starts_with(' ') {
        Ok(rendered[..at].to_owned())
    } else {
        Ok(rendered[..at].trim_end().to_owned())
    }
}

#[cfg(test)]
mod tests;
