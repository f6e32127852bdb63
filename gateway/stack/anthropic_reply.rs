//! Anthropic clients get Anthropic answers: a `/v1/messages` request ran down the stack as
//! the chat completion it was translated to (`api::parse`, `anthropic::to_chat`), and its
//! answer — checked by the guard like any chat's — is translated back here: a whole answer
//! with `anthropic::from_chat`, a stream event by event with `anthropic::StreamTranslator`
//! (`message_start`, content blocks, `message_delta` with usage, `message_stop`; an error
//! event the guard sent mid-stream becomes Anthropic's `error` event, and a stream that
//! ends without a finish never gets `message_stop`). Errors raised anywhere become
//! Anthropic's error shape in `rescue` (`ErrorDialect`).
//!
//! Sits below admission, so a stream's `message_start` carries admission's exact prompt
//! count (the guard keeps per-chunk usage from a client that did not ask for it).
//!
//! Reads: `InferenceRequest`, `TokenCount`, the request id.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use serde_json::Value;

use crate::anthropic::{self, AnthropicError, StreamTranslator};
use crate::body::{self, BoxBody, BoxError};
use crate::error::GatewayError;
use crate::stack::admission::TokenCount;
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::guard::sse::{rewrite_stream, Rewrite, SseEvent, StreamFailure};
use crate::stack::request_id::RequestId;
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};

/// The answer-translation stage for Anthropic clients.
#[derive(Debug, Clone, Default)]
pub struct AnthropicReply;

impl AnthropicReply {
    /// The stage as a layer.
    pub fn layer() -> StageLayer<Self> {
        StageLayer::new(Self)
    }
}

impl Stage for AnthropicReply {
    fn handle(&self, request: Request<Bytes>, next: Next) -> StageFuture {
        // Parsed as the chat it translates to: the route is the client's path (a plain
        // string compare on every request's way down).
        let anthropic = request.uri().path() == "/v1/messages";
        let Some(parsed) = request
            .extensions()
            .get::<InferenceRequest>()
            // An answer the engine wrote in Anthropic's shape itself passes as it is.
            .filter(|r| anthropic && r.endpoint != Endpoint::EngineMessages)
        else {
            return next.oneshot(request);
        };
        let model = parsed.model.clone();
        let stops = stop_strings(&parsed.fields);
        let count = request.extensions().get::<TokenCount>().cloned();
        let id = request
            .extensions()
            .get::<RequestId>()
            .map_or_else(|| "kvgate".to_owned(), |r| r.as_str().to_owned());
        Box::pin(async move {
            let response = next.oneshot(request).await?;
            let pool = response
                .headers()
                .get("x-kvgate-pool")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            let integrity = move |e: AnthropicError| GatewayError::UpstreamIntegrity {
                pool: pool.clone(),
                reason: e.to_string(),
            };
            let streamed = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let (mut parts, body) = response.into_parts();
            if !parts.status.is_success() {
                return Ok(Response::from_parts(parts, body));
            }
            parts.headers.remove(header::CONTENT_LENGTH);
            if streamed {
                let input = match &count {
                    Some(c) => c.exact().await.map(|n| n.iter().sum::<u64>()),
                    None => None,
                };
                let mut translator =
                    StreamTranslator::new(model, format!("msg_{id}")).with_stop_sequences(stops);
                if let Some(n) = input {
                    translator = translator.with_input_tokens(n);
                }
                return Ok(Response::from_parts(
                    parts,
                    translate_stream(body, translator),
                ));
            }
            let bytes = body
                .collect()
                .await
                .map_err(|e| GatewayError::Internal(format!("reading the answer: {e}")))?
                .to_bytes();
            let chat: Value = serde_json::from_slice(&bytes).map_err(|e| {
                integrity(AnthropicError::Upstream(format!(
                    "the answer is not JSON: {e}"
                )))
            })?;
            let message = anthropic::from_chat(&chat, &model, &stops).map_err(integrity)?;
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Ok::<Response<BoxBody>, BoxError>(Response::from_parts(
                parts,
                body::full(message.to_string()),
            ))
        })
    }
}

/// The chat's `stop` as strings (what `stop_sequences` became).
fn stop_strings(fields: &serde_json::Map<String, Value>) -> Vec<String> {
    match fields.get("stop") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// What the translation of one stream still holds.
struct StreamState {
    translator: StreamTranslator,
    /// Set once the stream is over (finished or failed).
    done: bool,
}

/// The engine's chat chunks (as the guard passed them) as Anthropic's events.
fn translate_stream(body: BoxBody, translator: StreamTranslator) -> BoxBody {
    rewrite_stream(
        body,
        StreamState {
            translator,
            done: false,
        },
    )
}

impl Rewrite for StreamState {
    fn events(&mut self, events: &[SseEvent]) -> Vec<u8> {
        translate(self, events)
    }

    fn failed(&mut self, why: StreamFailure) -> Vec<u8> {
        self.done = true;
        fail(&format!("the engine's stream failed: {why:?}"))
    }

    fn ended(&mut self) -> Vec<u8> {
        // No `[DONE]`: what the message still owes (an error event when it never
        // finished).
        self.done = true;
        events_bytes(self.translator.finish())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// Translate complete SSE events; `[DONE]` finishes the message.
fn translate(state: &mut StreamState, events: &[SseEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    for event in events {
        if state.done {
            break;
        }
        if event.is_done() {
            state.done = true;
            out.extend(events_bytes(state.translator.finish()));
            break;
        }
        let Some(chunk) = event.json() else {
            continue; // comments, keep-alives
        };
        match state.translator.on_chunk(&chunk) {
            Ok(translated) => out.extend(events_bytes(translated)),
            Err(e) => {
                state.done = true;
                out.extend(fail(&e.to_string()));
            }
        }
    }
    out
}

fn events_bytes(events: Vec<anthropic::Event>) -> Vec<u8> {
    events.iter().flat_map(|e| e.to_sse().to_vec()).collect()
}

fn fail(message: &str) -> Vec<u8> {
    anthropic::error_event("api_error", message)
        .to_sse()
        .to_vec()
}
