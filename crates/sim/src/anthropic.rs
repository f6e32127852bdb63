//! `POST /v1/messages` (and `/v1/messages/count_tokens`), as SGLang serves Anthropic's Messages API itself: the body becomes
//! the chat completions request SGLang builds (`kvgate_tokenize::prepare::anthropic`), which
//! runs exactly as a chat completion (same counting, prefix cache, limits and faults); its
//! answer is reshaped into Anthropic's.
//!
//! Modelled on sgl-project/sglang `python/sglang/srt/entrypoints/anthropic/serving.py` at
//! commit bef8e23885ea40a1c246143e5a699b484ef04c64 (`handle_messages`,
//! `_handle_non_streaming`, `_convert_response`, `_convert_openai_error_response`,
//! `_scrub_error_message`, `_anthropic_usage_from_openai`, `STOP_REASON_MAP`,
//! `ERROR_TYPE_MAP`; the stream, and the two maps both forms share, are
//! `anthropic_stream.rs`), compared with the older
//! 0198d48d21ccf1f0fc0015736b534948295b893b.
//!
//! - A request kvgate's conversion refuses (SGLang's own refusals and what it would convert
//!   differently by version) is a 400 `{"type": "error", "error": {"type":
//!   "invalid_request_error", "message"}}` (SGLang answers a conversion exception so).
//! - A prompt the engine refuses (over the context, over `max_req_input_len`) is, not
//!   streamed, the chat's `ErrorResponse` forwarded by `_convert_openai_error_response`:
//!   its status, its upstream `type` kept below 500 ("BadRequestError" for a 400; SGLang
//!   does not map it to `invalid_request_error`), the message scrubbed (truncated to 500
//!   characters; 5xx always "Internal server error", type from `ERROR_TYPE_MAP`). Streamed:
//!   HTTP 200 with `message_start` (usage 0/0), `error`, `message_stop`.
//! - `stop_reason`: stop → end_turn, length → max_tokens, tool_calls → tool_use, anything
//!   else (an abort without a status) → end_turn: a graceful abort is invisible here.
//!
//! Not modelled: the model name is not checked against the served model (SGLang's
//! Anthropic handler calls the chat's `_validate_request` and `_convert_to_internal_request`
//! directly); the answer names the request's model, as SGLang's chat response does.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use super::answer::{answers, Answer, Style};
use super::anthropic_stream::{self, error_type, message_id, stop_reason};
use super::config::SimRole;
use super::engine::SimEngine;
use super::errors::validation;
use super::fields::RouteBody;
use super::listen::{json_response, Body, ResetConnection};
use super::openai::error_object;
use super::reply::Reply;
use super::request::{Api, ParseError};
use super::run;
use super::schedule::SampleResult;
use kvgate_tokenize::prepare::anthropic::{sglang_count_tokens_chat, sglang_messages_chat};

/// `AnthropicErrorResponse`.
pub(crate) fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn error_response(status: u16, kind: &str, message: &str) -> Response<Body> {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &error_body(kind, message))
}

/// `_scrub_error_message`: 5xx say nothing; 4xx keep their message, traceback lines
/// dropped, cut at 500 characters.
fn scrub(message: &str, status: u16) -> String {
    if status >= 500 {
        return "Internal server error".into();
    }
    let kept: Vec<&str> = message
        .lines()
        .filter(|l| !l.starts_with("Traceback") && !l.contains("File \"/"))
        .collect();
    let cleaned = kept.join("\n");
    let cleaned = cleaned.trim();
    if cleaned.is_empty() {
        return "Request failed".into();
    }
    if cleaned.chars().count() > 500 {
        let cut: String = cleaned.chars().take(500).collect();
        return format!("{cut}…");
    }
    cleaned.to_owned()
}

/// `_convert_openai_error_response` of the chat's `ErrorResponse` for `message`, `status`.
fn forwarded_error(message: &str, status: u16) -> Reply {
    let kind = if status < 500 {
        error_object(message, status)
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("api_error")
            .to_owned()
    } else {
        error_type(status).to_owned()
    };
    Reply::Full {
        status,
        body: error_body(&kind, &scrub(message, status)),
    }
}

/// The content blocks of an answer (`_convert_response`): thinking, text, tool use; one
/// empty text block when there is none.
fn content(answer: &Answer) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(thought) = answer.reasoning.as_deref().filter(|t| !t.is_empty()) {
        blocks.push(json!({"type": "thinking", "thinking": thought}));
    }
    if let Some(text) = answer.content.as_deref().filter(|t| !t.is_empty()) {
        blocks.push(json!({"type": "text", "text": text}));
    }
    if let Some(call) = &answer.tool_call {
        let input = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    if blocks.is_empty() {
        blocks.push(json!({"type": "text", "text": ""}));
    }
    blocks
}

/// `_anthropic_usage_from_openai` of a whole answer: the prompt less its cached tokens
/// (reported only with `--enable-cache-report`), the cached ones when there are any.
fn usage(result: &SampleResult, output: usize, cache_report: bool) -> Value {
    let cached = if cache_report {
        result.cached_tokens
    } else {
        0
    };
    let mut usage = Map::new();
    usage.insert(
        "input_tokens".into(),
        json!(result.prompt_tokens.saturating_sub(cached)),
    );
    usage.insert("output_tokens".into(), json!(output));
    if cached > 0 {
        usage.insert("cache_read_input_tokens".into(), json!(cached));
    }
    Value::Object(usage)
}

/// The non-streamed reply and the tokens it took.
fn full(model: &str, result: &SampleResult, answer: &Answer, cache_report: bool) -> (Reply, usize) {
    if let Some((status, message)) = result.finish.error_status() {
        return (forwarded_error(message, status), answer.ids.len());
    }
    let body = json!({
        "id": message_id(), "type": "message", "role": "assistant",
        "content": content(answer), "model": model,
        "stop_reason": stop_reason(answer.finish),
        "usage": usage(result, answer.ids.len(), cache_report),
    });
    (Reply::Full { status: 200, body }, answer.ids.len())
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    engine: &Arc<SimEngine>,
    body: RouteBody,
) -> Result<Response<Body>, ResetConnection> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return Ok(validation(&message)),
    };
    let mut chat = match sglang_messages_chat(&body) {
        Ok(chat) => chat,
        Err(e) => return Ok(error_response(400, "invalid_request_error", &e.to_string())),
    };
    run::connection_faults(engine).await?;
    let model = chat
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let stream = chat.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // The engine serves whatever model the request names (see the module docs).
    chat.insert("model".into(), json!(engine.config.model));
    let gen = match run::parse(engine, Api::Chat, Value::Object(chat)).await {
        Some(Ok(gen)) => gen,
        Some(Err(ParseError::BadRequest(message))) => {
            return Ok(error_response(400, "invalid_request_error", &message))
        }
        Some(Err(other)) => {
            return Ok(error_response(
                400,
                "invalid_request_error",
                &other.to_string(),
            ))
        }
        None => return Ok(error_response(500, "api_error", "Internal server error")),
    };
    let ran = run::schedule(engine, &gen).await;
    let style = Style {
        tokenizer: &engine.tokenizer,
        template: engine.thinking,
        reasoning_parser: engine.config.reasoning_parser.is_some(),
        plain: engine.config.role == SimRole::Prefill,
    };
    let answer = answers(&gen, &ran.results, &style)
        .into_iter()
        .next()
        .and_then(|choices| choices.into_iter().next());
    let (Some(result), Some(answer)) = (ran.results.first(), answer) else {
        return Ok(error_response(500, "api_error", "Internal server error"));
    };
    let cache_report = engine.config.enable_cache_report;
    let (reply, tokens) = if stream {
        let events = anthropic_stream::events(&model, result, &answer);
        (Reply::Stream(events), answer.ids.len())
    } else {
        full(&model, result, &answer, cache_report)
    };
    run::send(engine, reply, tokens, ran).await
}

/// `POST /v1/messages/count_tokens` (`handle_count_tokens`): the same conversion with
/// `max_tokens` 1 (`sglang_count_tokens_chat`), the chat's prompt prepared and counted,
/// `{"input_tokens": n}`. A failure past the conversion is SGLang's 500 `api_error`. No
/// generation: no context check, no fault.
pub(crate) async fn count_tokens(engine: &Arc<SimEngine>, body: RouteBody) -> Response<Body> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return validation(&message),
    };
    let mut chat = match sglang_count_tokens_chat(&body) {
        Ok(chat) => chat,
        Err(e) => return error_response(400, "invalid_request_error", &e.to_string()),
    };
    chat.insert("model".into(), json!(engine.config.model));
    match run::parse(engine, Api::Chat, Value::Object(chat)).await {
        Some(Ok(gen)) => {
            let tokens = gen.samples.first().map_or(0, |s| s.input_ids.len());
            json_response(StatusCode::OK, &json!({"input_tokens": tokens}))
        }
        _ => error_response(500, "api_error", "Internal server error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_and_error_types_follow_sglang_maps() {
        assert_eq!(stop_reason("stop"), "end_turn");
        assert_eq!(stop_reason("length"), "max_tokens");
        assert_eq!(stop_reason("tool_calls"), "tool_use");
        assert_eq!(stop_reason("abort"), "end_turn");
        assert_eq!(error_type(400), "invalid_request_error");
        assert_eq!(error_type(503), "overloaded_error");
        assert_eq!(error_type(502), "api_error");
    }

    #[test]
    fn scrubbed_messages() {
        assert_eq!(scrub("boom", 500), "Internal server error");
        assert_eq!(scrub("Traceback (x)\ntoo long", 400), "too long");
        assert_eq!(scrub("", 400), "Request failed");
        let long = "x".repeat(600);
        assert_eq!(scrub(&long, 400).chars().count(), 501);
    }
}
