//! The Anthropic Messages API as a shape: pure translations between Anthropic's
//! `POST /v1/messages` and `/v1/messages/count_tokens` and the engines' OpenAI chat
//! completions, over `serde_json` values. No I/O here: the request pipeline parses an
//! Anthropic body into a chat body ([`to_chat`], [`count_tokens_to_chat`]), runs it through
//! the one stack like any chat request, and renders the engine's answer back
//! ([`from_chat`], [`StreamTranslator`], [`error_body`]).
//!
//! What is translated: `system`, `messages` with text, image (base64 or URL), tool_use,
//! tool_result and thinking blocks, `tools`, `tool_choice`, `stop_sequences`, `max_tokens`,
//! `temperature`, `top_p`, `top_k`, `metadata.user_id`, `stream`, `thinking` (as Qwen3's
//! `enable_thinking`), `output_config.format`. Stripped: `service_tier`, `cache_control`.
//! Refused, naming the field (fail-closed): server tools, MCP servers, containers, context
//! management, documents, Files API sources, and anything unknown. Each file's docs list its
//! rules and the vLLM function it follows.
//!
//! References: vLLM `vllm/entrypoints/anthropic/protocol.py` and `serving.py` (the same
//! translation inside an engine); Anthropic's Messages, streaming and errors pages
//! (docs.claude.com/en/api/messages, /en/docs/build-with-claude/streaming, /en/api/errors).

mod error;
mod json;
mod messages;
mod request;
mod response;
mod stream;
mod tools;

#[cfg(test)]
mod tests_request;
#[cfg(test)]
mod tests_response;
#[cfg(test)]
mod tests_stream;

pub use error::{error_body, error_type, AnthropicError};
pub use request::{
    count_tokens_to_chat, stop_sequences, to_chat, COUNT_TOKENS_FIELDS, MESSAGES_FIELDS,
    STRIPPED_FIELDS,
};
pub use response::{count_tokens_reply, from_chat, message_id};
pub use stream::{error_event, Event, StreamTranslator};
